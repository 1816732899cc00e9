//! Wake-ups across processes: every batch is announced with `NOTIFY dtask_commits` and
//! `<schema>:<last sequence>` once it is durable (by the writer's sync, or at a commit that
//! waited for the flush; a writer of `Durability::Buffered` announces at commit, durable or
//! not); a listener connection of each process that wants them turns those into a watermark
//! ([`tokio::sync::watch`]) of the last sequence announced by anyone. It wakes readers up and
//! bounds nothing: a read-only open makes what it shows durable by itself (module
//! `durable`). Notifications are a hint, not the truth: the listener also reads the last
//! sequence when it (re)connects and every second (making what it read durable first), so a
//! notification lost with a connection delays a wake-up by at most that much and loses
//! nothing.

use super::conn::{quote_ident, Target};
use futures_util::StreamExt;
use std::time::Duration;
use tokio::sync::{oneshot, watch};
use tokio_postgres::AsyncMessage;

/// The channel every journal's writers notify.
pub(crate) const CHANNEL: &str = "dtask_commits";

/// How often the listener reads the last sequence without being notified.
const POLL: Duration = Duration::from_secs(1);

/// The payload of a commit's notification.
pub(crate) fn payload(schema: &str, last_seq: u64) -> String {
    format!("{schema}:{last_seq}")
}

/// A running listener; it stops when this is dropped.
#[derive(Debug)]
pub(crate) struct Listener {
    pub watermark: watch::Receiver<u64>,
    _stop: oneshot::Sender<()>,
}

/// Starts a listener thread for `target`'s schema.
pub(crate) fn start(target: Target) -> std::io::Result<Listener> {
    let (tx, watermark) = watch::channel(0u64);
    let (stop_tx, mut stop) = oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("dtask-pg-listen".into())
        .spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                tokio::select! {
                    () = listen(&target, &tx) => {}
                    _ = &mut stop => {}
                }
            });
        })?;
    Ok(Listener {
        watermark,
        _stop: stop_tx,
    })
}

fn raise(tx: &watch::Sender<u64>, seq: u64) {
    tx.send_if_modified(|now| {
        let moved = seq > *now;
        *now = (*now).max(seq);
        moved
    });
}

/// Listens, reconnecting forever (until stopped from outside).
async fn listen(target: &Target, tx: &watch::Sender<u64>) {
    let prefix = format!("{}:", target.schema);
    let last_seq = format!(
        "SELECT coalesce(max(seq), 0) FROM {}.dtask_records",
        quote_ident(&target.schema)
    );
    loop {
        let Ok((client, mut connection)) = target.connect().await else {
            tokio::time::sleep(POLL).await;
            continue;
        };
        let (note_tx, mut notes) = tokio::sync::mpsc::unbounded_channel::<String>();
        let driver = tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(n) = message {
                    if note_tx.send(n.payload().to_owned()).is_err() {
                        break;
                    }
                }
            }
        });
        if client
            .batch_execute(&format!("LISTEN {CHANNEL}"))
            .await
            .is_ok()
        {
            loop {
                // What committed while no one was listening, and every POLL after.
                match super::durable::last_seq(&client, &last_seq).await {
                    Ok(seq) => raise(tx, seq),
                    Err(_) => break,
                }
                let deadline = tokio::time::sleep(POLL);
                tokio::pin!(deadline);
                loop {
                    tokio::select! {
                        () = &mut deadline => break,
                        note = notes.recv() => match note {
                            None => break,
                            Some(payload) => {
                                if let Some(seq) = payload.strip_prefix(&prefix).and_then(|s| s.parse().ok()) {
                                    raise(tx, seq);
                                }
                            }
                        },
                    }
                }
                if client.is_closed() {
                    break;
                }
            }
        }
        driver.abort();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
