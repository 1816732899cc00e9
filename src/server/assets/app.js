// The web view of `dtask serve`: hand-written, no dependencies, no build step.
// Three pages (hash routes): #/ the task list, #/task/<id> one task, #/journal the journal.
"use strict";

const AGENT_EXECUTOR = "dtask.dev/agent";
const STATUSES = ["pending", "running", "waiting_input", "suspended", "completed", "failed", "canceled"];
const main = document.getElementById("main");
const liveBadge = document.getElementById("live");
let mode = "";
let source = null; // the open EventSource
let reopenTimer = null; // a closed stream's next try
// The route shown, counted: a page that finds it changed after one of its awaits has been
// navigated away from, and stops (it must not follow a stream, nor write into the page).
let generation = 0;

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

async function api(path, options) {
  const response = await fetch(path, options);
  const text = await response.text();
  const body = text ? JSON.parse(text) : null;
  if (!response.ok) {
    const e = body && body.error ? body.error : { code: String(response.status), message: text };
    throw new Error(`${e.code}: ${e.message}`);
  }
  return body;
}

function time(ms) {
  if (!ms) return "-";
  const date = new Date(ms);
  // A number no date can hold (nanoseconds taken for milliseconds, say) is shown as it is.
  if (Number.isNaN(date.getTime())) return String(ms);
  return date.toISOString().replace("T", " ").replace("Z", "");
}

function statusBadge(s) {
  return h("span", { class: `status ${s || "unknown"}` }, s || "?");
}

// Follows the event stream at `url` for the page of route generation `gen` (nothing for a
// page navigated away from), in place of the stream followed before. The browser reconnects
// by itself after a network error; a stream it closes for good (an answer other than 200: 503
// when too many streams are open, a proxy's 502) is opened again here, later and later (1 s,
// doubling up to 30 s), from the record after the last one received.
function follow(url, onRecord, gen) {
  if (gen !== generation) return;
  if (source) source.close();
  clearTimeout(reopenTimer);
  let delay = 1000;
  let last = null; // the id (global sequence) of the last record received
  const open = (from) => {
    const es = new EventSource(from);
    source = es;
    es.addEventListener("open", () => {
      delay = 1000;
      liveBadge.textContent = "live"; liveBadge.className = "live on";
    });
    es.addEventListener("error", () => {
      liveBadge.textContent = "reconnecting"; liveBadge.className = "live off";
      if (es.readyState !== EventSource.CLOSED || source !== es || gen !== generation) return;
      reopenTimer = setTimeout(() => {
        if (source !== es || gen !== generation) return;
        const next = new URL(url, location.href);
        if (last !== null) next.searchParams.set("from_seq", String(last + 1));
        open(next.pathname + next.search);
      }, delay);
      delay = Math.min(delay * 2, 30000);
    });
    es.addEventListener("record", (e) => {
      if (e.lastEventId) last = Number(e.lastEventId);
      onRecord(JSON.parse(e.data));
    });
  };
  open(url);
}

function setNav(name) {
  for (const a of document.querySelectorAll("header nav a")) {
    a.classList.toggle("active", a.dataset.nav === name);
  }
}

// ---- the task list -------------------------------------------------------------------

// Record types that never change a task's status.
const QUIET = new Set(["heartbeat", "update_appended", "part_appended", "notification_enqueued",
  "notification_enqueued_v2", "notification_acked", "parent_notified", "parent_notified_v2",
  "input_sent", "cursor_advanced", "update_trimmed", "progress_trimmed", "hold", "hold_lifted"]);

const listState = { status: "", tool: "", executor: "", q: "" };

async function tasksPage(gen) {
  setNav("tasks");
  const rows = new Map();
  const tbody = h("tbody");
  const more = h("button", { hidden: true }, "More");
  const info = h("p", { class: "muted" });
  let cursor = null;

  const matches = (t) =>
    (!listState.status || t.status === listState.status) &&
    (!listState.tool || t.tool === listState.tool) &&
    (!listState.executor || t.executor === listState.executor) &&
    (!listState.q || [t.id, t.description, t.tool || ""].some((s) => s.toLowerCase().includes(listState.q.toLowerCase())));

  const row = (t) =>
    h("tr", { "data-id": t.id },
      h("td", {}, h("a", { href: `#/task/${encodeURIComponent(t.id)}`, class: "mono" }, t.id)),
      h("td", {}, statusBadge(t.status),
        t.not_before ? h("span", { class: "muted", title: "not claimed before then" }, ` until ${time(t.not_before)}`) : null,
        t.problem ? h("span", { class: "problem", title: t.problem }, " !") : null),
      h("td", {}, t.executor), h("td", {}, t.tool || "-"),
      h("td", { class: "num" }, t.attempt), h("td", { class: "num" }, t.records),
      h("td", {}, time(t.created_at)), h("td", {}, time(t.updated_at)),
      h("td", { class: "muted" }, t.description));

  const render = () => {
    tbody.replaceChildren(...[...rows.values()].sort((a, b) => (a.id < b.id ? -1 : 1)).map(row));
    info.textContent = `${rows.size} task${rows.size === 1 ? "" : "s"} shown`;
  };

  // Each row keeps `read`, the `last_seq` of the read it shows (a read older than that, come
  // late, is dropped) and `seq`, its last record counted (reads and the stream's records).
  // Loads are counted: the answer of one that another has followed (a filter typed on,
  // "More" then a new filter) is dropped, so that the rows of two filters never mix.
  let loads = 0;
  const load = async (reset) => {
    const asked = ++loads;
    const params = new URLSearchParams({ limit: "100" });
    for (const k of ["status", "tool", "executor", "q"]) if (listState[k]) params.set(k, listState[k]);
    if (!reset && cursor) params.set("cursor", cursor);
    const page = await api(`/api/tasks?${params}`);
    if (asked !== loads || gen !== generation) return;
    if (reset) rows.clear();
    for (const t of page.tasks) {
      const shown = rows.get(t.id);
      if (shown && shown.read > t.last_seq) continue;
      rows.set(t.id, { ...t, seq: t.last_seq, read: t.last_seq });
    }
    cursor = page.next_cursor;
    more.hidden = !cursor;
    render();
  };
  more.addEventListener("click", () => load(false));

  const input = (key, placeholder) => {
    const el = h("input", { type: "search", placeholder, value: listState[key] });
    let timer = null;
    el.addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(() => { listState[key] = el.value.trim(); load(true); }, 250);
    });
    return el;
  };
  const statusSelect = h("select", { id: "status-filter" }, h("option", { value: "" }, "any status"),
    STATUSES.map((s) => h("option", { value: s, selected: s === listState.status }, s)));
  statusSelect.addEventListener("change", () => { listState.status = statusSelect.value; load(true); });

  main.replaceChildren(
    h("h1", {}, "Tasks"),
    h("div", { class: "filters" },
      h("label", {}, "status"), statusSelect,
      h("label", {}, "tool"), input("tool", "tool name"),
      h("label", {}, "executor"), input("executor", "executor key"),
      h("label", {}, "search"), input("q", "id, description, tool")),
    h("table", { id: "tasks" },
      h("thead", {}, h("tr", {}, ["ID", "STATUS", "EXECUTOR", "TOOL"].map((c) => h("th", {}, c)),
        h("th", { class: "num" }, "ATTEMPT"), h("th", { class: "num" }, "RECORDS"),
        ["CREATED", "UPDATED", "DESCRIPTION"].map((c) => h("th", {}, c)))),
      tbody),
    more, info);
  // The stream starts after the last commit the server had read before the list was: a
  // record committed between the list's read and the stream's start is not missed, and one
  // the list's read holds is not counted twice (each row's `seq` is its last record's).
  let start = 0;
  try { start = (await api("/api/stats")).last_seq || 0; } catch (_) { /* from now on */ }
  if (gen !== generation) return;
  try { await load(true); } catch (e) { if (gen === generation) main.append(h("p", { class: "error" }, e.message)); }
  if (gen !== generation) return;

  // Live: a record that may change its task's status refreshes the task's row (which may
  // bring it into the list, or take it out). A task's other records (its progress,
  // heartbeats, notifications: nearly all of a busy journal's) cost no request: a shown
  // task counts them in its row — those past the last read of the task (`seq`), which
  // counted the ones before — and a task not shown stays as it was.
  // The reads run one flush at a time (records coming meanwhile wait for the next), so
  // that a task's reads never overlap: an older answer cannot land after a newer one.
  const pending = new Set();
  let flush = null;
  let flushing = false;
  let counted = null;
  const refreshRows = async () => {
    flush = null;
    flushing = true;
    const ids = [...pending];
    pending.clear();
    for (const id of ids) {
      const shown = rows.get(id);
      if (shown) shown.reading = [];
      try {
        const detail = await api(`/api/tasks/${encodeURIComponent(id)}`);
        const s = detail.state;
        const now = rows.get(id);
        // A row read since (by a load) more recently than this read stays as it is.
        if (s && !(now && now.read > detail.last_seq)) {
          // Records counted from the stream while the read ran, past what it read.
          const late = shown && shown.reading ? shown.reading.filter((seq) => seq > detail.last_seq) : [];
          const t = { id, status: s.status, executor: s.executor_key, tool: s.tool, attempt: s.attempt,
            records: detail.records + late.length, seq: Math.max(detail.last_seq, ...late), read: detail.last_seq,
            created_at: s.created_at, updated_at: s.updated_at, not_before: s.not_before,
            description: s.description, problem: detail.problems.length ? detail.problems.join("; ") : null };
          if (matches(t)) rows.set(id, t); else rows.delete(id);
        }
      } catch (_) { /* the task's next record that is fetched retries */ }
      if (shown) shown.reading = null;
    }
    flushing = false;
    if (gen !== generation) return;
    render();
    for (const id of ids) {
      const tr = tbody.querySelector(`tr[data-id="${CSS.escape(id)}"]`);
      if (tr) tr.classList.add("flash");
    }
    if (pending.size && !flush) flush = setTimeout(refreshRows, 150);
  };
  follow(start ? `/api/stream?from_seq=${start + 1}` : "/api/stream", (record) => {
    if (QUIET.has(record.type)) {
      const t = rows.get(record.task);
      if (!t || record.seq <= (t.seq || 0)) return;
      t.records += 1;
      t.seq = record.seq;
      // Counted while the task is being read: the read's answer may not hold it.
      if (t.reading) t.reading.push(record.seq);
      if (!counted) counted = setTimeout(() => { counted = null; render(); }, 150);
      return;
    }
    pending.add(record.task);
    if (flush || flushing) return;
    flush = setTimeout(refreshRows, 150);
  }, gen);
}

// ---- one task ------------------------------------------------------------------------

function timeline(records) {
  const items = [];
  let attempt = null;
  for (const r of records) {
    const e = r.event;
    const at = time(r.at);
    switch (r.type) {
      case "created": items.push(["", `created (executor ${e.spec.executor_key}, policy ${e.policy})`, r]); break;
      case "attempt_started":
        attempt = { n: e.attempt, heartbeats: 0, item: null };
        attempt.item = ["attempt", `attempt ${e.attempt} started`, r];
        items.push(attempt.item);
        break;
      case "heartbeat":
        if (attempt) { attempt.heartbeats += 1; attempt.item[1] = `attempt ${attempt.n} started · ${attempt.heartbeats} heartbeat${attempt.heartbeats === 1 ? "" : "s"}, last ${at}`; }
        break;
      case "start_committed": items.push(["attempt", "started marker committed (checkpoint)", r]); break;
      case "update_appended": items.push(["", `update ${e.kind || ""} #${e.event_id} (attempt ${e.attempt})`, r]); break;
      case "update_trimmed": items.push(["", `update ${e.kind || ""} #${e.event_id} (attempt ${e.attempt}; ${e.bytes} bytes trimmed)`, r]); break;
      case "progress_trimmed": items.push(["", `progress trimmed: ${e.records} updates, ${e.bytes} bytes saved`, r]); break;
      case "parent_notified": items.push(["", `notified its parent: ${e.kind} #${e.event_id} (attempt ${e.attempt})`, r]); break;
      case "parent_notified_v2": items.push(["", `notified its parent: ${e.kind} #${e.event_id} (attempt ${e.attempt}, ${e.delivery})`, r]); break;
      case "notification_enqueued_v2": items.push(["", `notification ${e.kind} #${e.event_id} queued for its session (${e.delivery})`, r]); break;
      case "input_sent": items.push(["", `input ${e.sequence}: ${e.kind} #${e.event_id}${e.delivery === "preempt" ? " (to preempt)" : ""}`, r]); break;
      case "cursor_advanced": items.push(["", `inputs read up to ${e.cursor} (attempt ${e.attempt})`, r]); break;
      case "input_committed": items.push(["", `inputs read up to ${e.cursor}, checkpoint committed`, r]); break;
      case "inputs_pending": items.push(["wait", `inputs after ${e.cursor} unread: back to pending`, r]); break;
      case "waiting_input": items.push(["wait", "waiting for input", r]); break;
      case "input_provided": items.push(["wait", "input provided", r]); break;
      case "suspended": items.push(["wait", "suspended", r]); break;
      case "released": items.push(["wait", "released", r]); break;
      case "yielded": items.push(["", "yielded (back to pending)", r]); break;
      case "cancel_requested": items.push(["cancel", `cancel requested: ${e.reason || "(no reason)"}${e.direct ? " (direct)" : ""}`, r]); break;
      case "lease_expired": items.push(["bad", `lease expired (${e.resolution})`, r]); break;
      case "completed": items.push(["outcome", "completed", r]); break;
      case "failed": items.push(["bad", `failed: ${e.error}`, r]); break;
      case "canceled": items.push(["cancel", `canceled: ${e.reason}`, r]); break;
      case "transcript_failed": items.push(["bad", `transcript failed: ${e.error}`, r]); break;
      case "rerun_of": items.push(["", `a rerun of ${e.task}`, r]); break;
      case "rerun_as": items.push(["", `rerun as ${e.task}`, r]); break;
      case "purged": items.push(["", `purged: its ${e.records} records deleted`, r]); break;
      case "hold": items.push(["", `held: ${e.reason}`, r]); break;
      case "hold_lifted": items.push(["", "hold lifted", r]); break;
      case "not_before": items.push(["wait", `not before ${time(e.until)}`, r]); break;
      case "recovery_limit": items.push(["", `recovered at most ${e.max_recoveries} time${e.max_recoveries === 1 ? "" : "s"}`, r]); break;
      default: items.push(["", r.type.replace(/_/g, " "), r]);
    }
  }
  return h("ol", { class: "timeline" }, items.map(([cls, text, r]) =>
    h("li", { class: cls }, h("span", { class: "muted mono" }, `#${r.position} ${time(r.at)} `), text)));
}

function stateList(s) {
  if (!s) return h("p", { class: "error" }, "the stream does not fold");
  const bytes = (b) => (b ? (b.text !== undefined ? `${b.text}${b.truncated ? "…" : ""} (${b.size} B)` : `${b.size} B`) : "-");
  const pairs = [
    ["status", statusBadge(s.status)], ["version", s.version], ["attempt", s.attempt], ["records", s.records],
    ["updates", s.trimmed_updates ? `${s.updates} (${s.trimmed_updates} trimmed)` : s.updates], ["executor", s.executor_key], ["tool", s.tool || "-"], ["kind", s.kind || "-"],
    ["policy", s.policy], ["description", s.description || "-"], ["payload", bytes(s.payload)],
    ["checkpoint", bytes(s.checkpoint)], ["created", time(s.created_at)], ["updated", time(s.updated_at)],
    ["done", time(s.done_at)], ["lease until", time(s.lease_deadline)],
  ];
  if (s.pending_resume) pairs.push(["pending resume", bytes(s.pending_resume)]);
  if (s.not_before) pairs.push(["not before", time(s.not_before)]);
  if (s.max_recoveries !== null || s.recoveries) pairs.push(["recoveries", s.max_recoveries === null ? s.recoveries : `${s.recoveries} (at most ${s.max_recoveries})`]);
  if (s.cancel_requested_at) pairs.push(["cancel", `${time(s.cancel_requested_at)}: ${s.cancel_reason}`]);
  if (s.status === "completed") pairs.push(["result", bytes(s.result_data)]);
  if (s.result_error) pairs.push(["error", s.result_error]);
  const taskLink = (id) => h("a", { href: `#/task/${encodeURIComponent(id)}`, class: "mono" }, id);
  if (s.rerun_of) pairs.push(["rerun of", taskLink(s.rerun_of)]);
  if (s.hold) pairs.push(["on hold", s.hold]);
  if (s.rerun_as && s.rerun_as.length) pairs.push(["rerun as", s.rerun_as.flatMap((id, i) => (i ? [", ", taskLink(id)] : [taskLink(id)]))]);
  return h("dl", { class: "kv" }, pairs.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

// A durable agent's run as a conversation (GET /api/tasks/<id>/conversation).
function conversationView(c) {
  if (c.problem) return h("p", { class: "problem", id: "conversation" }, `the run's entries do not fold: ${c.problem}`);
  const line = (cls, role, ...text) => h("div", { class: `msg ${cls}` }, h("span", { class: "role" }, role), h("span", { class: "text" }, ...text));
  const rows = c.messages.map((m) => line(m.role, m.role, m.content || ""));
  const sent = c.sent_messages.slice();
  const takeSent = (after) => {
    while (sent.length && sent[0].after_turn === after) {
      const m = sent.shift();
      rows.push(line("user sent", `user (sent, input ${m.sequence})`, m.content));
    }
  };
  takeSent(0);
  for (const t of c.turns) {
    const cost = t.usage ? ` · ${t.usage.total_tokens} tokens` : "";
    rows.push(line("assistant", `assistant · turn ${t.turn}${cost}`, t.content || ""));
    for (const call of t.calls) {
      const result = call.result ? `${call.result.status}: ${call.result.content}` : "(no result yet)";
      rows.push(line("call", `→ ${call.tool}`, h("code", {}, call.arguments), " · ",
        h("a", { href: `#/task/${encodeURIComponent(call.task_id)}` }, call.task_id), ` ${call.task_status || "not created"}`,
        h("div", { class: "result" }, `← ${result}`)));
    }
    takeSent(t.turn);
  }
  return h("div", { class: "conversation", id: "conversation" }, rows,
    h("p", { class: "muted" }, `${c.interactive ? "interactive · " : ""}${c.turns.length} of at most ${c.max_steps} model calls · ${c.usage.total_tokens} tokens`));
}

async function taskPage(id, gen) {
  setNav("");
  const path = `/api/tasks/${encodeURIComponent(id)}`;
  const stateBox = h("div");
  const timelineBox = h("div");
  const recordsBody = h("tbody");
  const slider = h("input", { type: "range", min: "0", max: "0", value: "0", id: "at" });
  const sliderLabel = h("span", { class: "mono" });
  const atBox = h("div");
  const actions = h("div", { class: "actions" });
  const message = h("p");
  const records = [];
  // A durable agent's run: its conversation, and (owner mode, while it runs) a message box
  // made once, so that refreshes do not clear what is being typed.
  const conversationHead = h("h2", { hidden: true }, "Conversation");
  const conversationBox = h("div");
  const agentText = h("input", { placeholder: "a message to the agent", id: "agent-message", size: 48 });
  const agentPreempt = h("input", { type: "checkbox", id: "agent-preempt" });
  const agentClose = h("button", { id: "agent-close", hidden: true, title: "end the conversation once what was sent is answered", onclick: async () => {
    try {
      await api(`${path}/close`, { method: "POST" });
      message.replaceChildren(h("span", { class: "muted", id: "agent-closed" }, "closing: the run ends once it has answered"));
    } catch (e) { message.replaceChildren(h("span", { class: "error" }, e.message)); }
  } }, "Close the conversation");
  const agentBox = h("div", { class: "actions", hidden: true },
    agentText, h("label", { title: "drop the model call in flight and ask again with the message" }, agentPreempt, " preempt"),
    h("button", { id: "agent-send", onclick: async (event) => {
      const button = event.currentTarget;
      if (!agentText.value.trim()) {
        message.replaceChildren(h("span", { class: "error" }, "write a message first"));
        return;
      }
      // One click, one message: the button waits for the server's answer.
      button.disabled = true;
      try {
        const sent = await api(`${path}/messages`, { method: "POST", headers: { "content-type": "application/json" },
          body: JSON.stringify({ text: agentText.value, preempt: agentPreempt.checked }) });
        message.replaceChildren(h("span", { class: "muted", id: "agent-sent" }, `message sent (input ${sent.sequence})`));
        agentText.value = "";
      } catch (e) { message.replaceChildren(h("span", { class: "error" }, e.message)); }
      button.disabled = false;
    } }, "Send to the agent"),
    agentClose);
  let isAgent = false;
  let conversationTimer = null;
  let conversationAsked = 0; // the last request made: an older answer arriving late is dropped
  const refreshConversation = () => {
    if (!isAgent) return;
    clearTimeout(conversationTimer);
    conversationTimer = setTimeout(async () => {
      const asked = ++conversationAsked;
      try {
        const c = await api(`${path}/conversation`);
        if (asked !== conversationAsked) return;
        agentClose.hidden = !c.interactive;
        conversationBox.replaceChildren(conversationView(c));
      } catch (e) {
        if (asked === conversationAsked) conversationBox.replaceChildren(h("p", { class: "error" }, e.message));
      }
    }, 150);
  };

  main.replaceChildren(h("h1", { class: "mono" }, id), stateBox, actions, agentBox, message,
    conversationHead, conversationBox,
    h("h2", {}, "Timeline"), timelineBox,
    h("h2", {}, "State at position"), h("div", { class: "slider" }, slider, sliderLabel), atBox,
    h("h2", {}, "Records"),
    h("table", { id: "records" }, h("thead", {}, h("tr", {},
      ["POS", "SEQ", "TIME", "TYPE", "CRC", "DIGEST", "SIZE"].map((c) => h("th", {}, c)))), recordsBody));

  // The task's state now; returns what it read (null when it could not, or when a read
  // asked after it answered first: an older state never replaces a newer one).
  let stateAsked = 0;
  let stateShown = 0;
  const refreshState = async () => {
    const asked = ++stateAsked;
    try {
      const detail = await api(path);
      if (asked < stateShown) return null;
      stateShown = asked;
      stateBox.replaceChildren(stateList(detail.state),
        detail.problems.length ? h("p", { class: "problem" }, detail.problems.join("; ")) : "");
      renderActions(detail.state);
      return detail;
    } catch (e) {
      if (asked < stateShown) return null;
      stateShown = asked;
      stateBox.replaceChildren(h("p", { class: "error" }, e.message));
      actions.replaceChildren();
      return null;
    }
  };

  const act = async (what, body) => {
    try {
      await api(`${path}/${what}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
      message.replaceChildren(h("span", { class: "muted" }, `${what}: done`));
    } catch (e) { message.replaceChildren(h("span", { class: "error" }, e.message)); }
    refreshState();
  };
  const renderActions = (s) => {
    actions.replaceChildren();
    const terminal = s && ["completed", "failed", "canceled"].includes(s.status);
    isAgent = !!s && s.executor_key === AGENT_EXECUTOR;
    conversationHead.hidden = !isAgent;
    agentBox.hidden = !(isAgent && mode === "owner" && !terminal);
    refreshConversation();
    if (mode !== "owner" || !s) return;
    if (!terminal) {
      const reason = h("input", { placeholder: "reason", id: "cancel-reason" });
      actions.append(reason, h("button", { onclick: () => act("cancel", { reason: reason.value }) }, "Cancel"));
    }
    if (s.status === "waiting_input") {
      const input = h("input", { placeholder: "input", id: "resume-data" });
      actions.append(input, h("button", { onclick: () => act("resume", { data: input.value, expected_version: s.version }) }, "Resume"));
    }
    if (s.status === "suspended") actions.append(h("button", { onclick: () => act("release", {}) }, "Release"));
    if (terminal && !s.parent_task_id) {
      actions.append(h("button", { id: "rerun", onclick: async () => {
        try {
          const rerun = await api(`${path}/rerun`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
          location.hash = `#/task/${encodeURIComponent(rerun.id)}`;
        } catch (e) { message.replaceChildren(h("span", { class: "error" }, e.message)); }
      } }, "Rerun"));
      // Two clicks: a purge deletes the task's records for good.
      const purge = h("button", { id: "purge", onclick: async () => {
        if (purge.dataset.armed !== "yes") {
          purge.dataset.armed = "yes";
          purge.textContent = "Purge: click again to delete its records";
          return;
        }
        try {
          const done = await api(path, { method: "DELETE" });
          const records = done.purged.reduce((n, p) => n + p.records, 0);
          message.replaceChildren(h("span", { class: "muted" }, `purged: ${done.purged.length} task(s), ${records} records deleted`));
        } catch (e) { message.replaceChildren(h("span", { class: "error" }, e.message)); }
        refreshState();
      } }, "Purge");
      actions.append(purge);
    }
  };

  // The state after the slider's position. `detail` (the task's state just read, if any)
  // answers the last position without a second read of the whole stream, when it is the
  // state after the slider's record and the stream folds cleanly.
  const showAt = async (detail) => {
    sliderLabel.textContent = `${slider.value} / ${slider.max}`;
    const shown = (at, state) => atBox.replaceChildren(
      h("p", { class: "muted" }, `after #${at.position} ${at.type} (sequence ${at.seq}, ${time(at.time)})`), stateList(state));
    const record = records[Number(slider.value)];
    if (detail && detail.state && !detail.problems.length && record && record.position === detail.records - 1) {
      shown({ position: record.position, type: record.type, seq: record.seq, time: record.at }, detail.state);
      return;
    }
    try {
      const at = await api(`${path}/state?at=${slider.value}`);
      shown(at.at, at.state);
    } catch (e) { atBox.replaceChildren(h("p", { class: "error" }, e.message)); }
  };
  let sliderTimer = null;
  slider.addEventListener("input", () => { clearTimeout(sliderTimer); sliderTimer = setTimeout(showAt, 120); });

  const addRecords = (list, live) => {
    for (const r of list) {
      if (records.length && r.position <= records[records.length - 1].position) continue;
      records.push(r);
      recordsBody.append(h("tr", { class: live ? "flash" : "" },
        h("td", { class: "num" }, r.position), h("td", { class: "num" }, r.seq), h("td", {}, time(r.at)),
        h("td", {}, r.type), h("td", { class: "mono" }, r.crc),
        h("td", { class: "mono", title: r.digest }, r.digest.slice(0, 16) + "…"), h("td", { class: "num" }, r.size)));
    }
    timelineBox.replaceChildren(timeline(records));
    const follow = Number(slider.value) === Number(slider.max);
    slider.max = String(Math.max(0, records.length - 1));
    if (follow) slider.value = slider.max;
  };

  await refreshState();
  if (gen !== generation) return;
  try {
    let from = 0;
    for (;;) {
      const page = await api(`${path}/records?from=${from}`);
      if (gen !== generation) return;
      addRecords(page.records);
      if (page.damaged.length) message.replaceChildren(h("span", { class: "problem" }, `damaged: ${page.damaged.map((d) => `#${d.position} ${d.problem}`).join("; ")}`));
      if (page.next_from === null) break;
      from = page.next_from;
    }
  } catch (e) { message.replaceChildren(h("span", { class: "error" }, e.message)); }
  if (gen !== generation) return;
  slider.value = slider.max;
  showAt();
  const last = records.length ? records[records.length - 1].seq : 0;
  // Each record joins the timeline at once; the state (and the conversation) is read again
  // at most every 250 ms, however fast the task writes: each read folds its whole stream.
  let stale = null;
  follow(`${path}/stream?from_seq=${last + 1}`, (r) => {
    addRecords([r], true);
    if (stale) return;
    stale = setTimeout(async () => {
      stale = null;
      const detail = await refreshState();
      if (Number(slider.value) === Number(slider.max)) showAt(detail);
    }, 250);
  }, gen);
}

// ---- the journal ---------------------------------------------------------------------

async function journalPage(gen) {
  setNav("journal");
  const statsBox = h("div");
  const verifyBox = h("div");
  const button = h("button", { id: "verify" }, "Verify the journal");
  main.replaceChildren(h("h1", {}, "Journal"), statsBox, h("h2", {}, "Audit"), button, verifyBox);
  const table = (title, map) => h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, title), h("th", { class: "num" }, "COUNT"))),
    h("tbody", {}, Object.entries(map).map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", { class: "num" }, v)))));
  const size = (n) => n < 1024 ? `${n} B` : n < 1 << 20 ? `${(n / 1024).toFixed(1)} KiB`
    : n < 1 << 30 ? `${(n / (1 << 20)).toFixed(1)} MiB` : `${(n / (1 << 30)).toFixed(1)} GiB`;
  // The storage engine's own figures (RocksDB; none on PostgreSQL): what it owes its
  // background threads, and whether it holds writes back.
  const storage = (st) => !st ? "" : h("div", { id: "storage" }, h("h2", {}, "Storage"),
    h("table", {},
      h("thead", {}, h("tr", {}, ["SPACE", "MEMTABLES", "WAITING FOR FLUSH", "LEVEL-0 FILES", "TABLE FILES", "COMPACTION OWED", "KEYS (EST.)"]
        .map((c, i) => h("th", i ? { class: "num" } : {}, c)))),
      h("tbody", {}, st.spaces.map((sp) => h("tr", {}, h("td", {}, sp.name),
        [size(sp.memtable_bytes), sp.immutable_memtables, sp.level0_files, size(sp.table_bytes), size(sp.pending_compaction_bytes), sp.estimated_keys]
          .map((v) => h("td", { class: "num" }, v)))))),
    h("p", { id: "storage-writes", class: st.write_stopped || st.delayed_write_rate ? "problem" : "muted" },
      `${st.running_flushes} flush(es) and ${st.running_compactions} compaction(s) running · writes ${st.write_stopped ? "stopped" : st.delayed_write_rate ? `slowed to ${size(st.delayed_write_rate)}/s` : "not held back"} · ${st.background_errors} background error(s)${st.direct_table_io ? " · table files written with direct I/O" : ""}`));
  const health = async () => {
    const text = await readiness();
    return h("p", { id: "health", class: text === "ready" ? "muted" : "problem" }, text);
  };
  const refresh = async () => {
    const s = await api("/api/stats");
    const ready = await health();
    statsBox.replaceChildren(ready,
      h("div", { class: "cards" },
        [["tasks", s.tasks], ["records", s.records], ["bytes", s.bytes], ["last sequence", s.last_seq],
          ["with problems", s.tasks_with_problems], ["queued notifications", s.outbox ?? "?"], ["streams", s.subscribers]].map(([k, v]) => h("div", { class: "card" }, h("b", {}, v), k))),
      h("p", { class: "muted" }, `${s.mode} · journal format ${s.journal_format} · record format ${s.record_format}${s.counted ? "" : " · counting…"}`),
      // What a synced append promises where the journal lies (dtask probe); none on PostgreSQL.
      s.sync_promise ? h("p", { id: "sync-promise", class: s.sync_promise.promise === "lost" ? "problem" : "muted" },
        `synced appends: ${s.sync_promise.promise} — ${s.sync_promise.why}`) : "",
      h("div", { class: "cards" }, table("STATUS", s.by_status), table("EXECUTOR", s.by_executor), table("EVENT TYPE", s.by_type)),
      storage(s.storage));
  };
  button.addEventListener("click", async () => {
    button.disabled = true;
    verifyBox.replaceChildren(h("p", { class: "muted" }, "verifying…"));
    try {
      const r = await api("/api/verify", { method: "POST" });
      verifyBox.replaceChildren(
        h("p", { id: "verify-result", class: r.clean ? "" : "problem" },
          `${r.clean ? "clean" : `${r.problems.length} problem(s)`}: ${r.tasks} tasks, ${r.records} records, ${r.bytes} bytes, last sequence ${r.last_seq}, ${r.live} live, ${r.outbox} queued notifications (${r.elapsed_ms} ms)`),
        r.problems.length ? h("table", {}, h("tbody", {}, r.problems.map((p) =>
          h("tr", {}, h("td", { class: "mono" }, p.task), h("td", {}, p.position ?? "-"), h("td", {}, p.kind), h("td", {}, p.detail))))) : "");
    } catch (e) { verifyBox.replaceChildren(h("p", { class: "error" }, e.message)); }
    button.disabled = false;
  });
  await refresh();
  let timer = null;
  follow("/api/stream", () => { if (!timer) timer = setTimeout(() => { timer = null; refresh(); }, 500); }, gen);
}

// ---- readiness -----------------------------------------------------------------------

const READY = {
  journal_stopped: "the journal stopped after a failed sync: restart the process",
  disk_full: "the journal's disk is full: writes fail until there is room",
  journal_failing: "the journal's last write failed",
  counting: "counting the journal",
  journal_unreadable: "the last read of the journal failed",
  stopping: "the server is stopping",
};

// `/readyz` as a sentence: "ready", or "not ready: " and why. (A 503 names why not, so it
// is read without `api`, which throws.)
async function readiness() {
  try {
    const r = await (await fetch("/readyz")).json();
    return r.status === "ok" ? "ready" : `not ready: ${r.reasons.map((x) => READY[x] || x).join("; ")}`;
  } catch (e) { return `readiness unknown: ${e.message}`; }
}

// The header's badge: shown only when the server is not ready, checked every 5 s.
const readyBadge = document.getElementById("ready");
async function checkReady() {
  const text = await readiness();
  readyBadge.textContent = text === "ready" ? "" : text;
  readyBadge.className = text === "ready" ? "ready" : "ready bad";
}
checkReady();
setInterval(checkReady, 5000);

// ---- routing -------------------------------------------------------------------------

async function route() {
  const gen = ++generation;
  const hash = location.hash || "#/";
  try {
    if (hash.startsWith("#/task/")) await taskPage(decodeURIComponent(hash.slice(7)), gen);
    else if (hash === "#/journal") await journalPage(gen);
    else await tasksPage(gen);
  } catch (e) {
    if (gen === generation) main.replaceChildren(h("p", { class: "error" }, e.message));
  }
}

window.addEventListener("hashchange", route);
api("/api/stats").then((s) => {
  mode = s.mode;
  document.getElementById("mode").textContent = s.mode === "owner" ? "owner" : "read-only";
}).catch(() => {}).finally(route);
