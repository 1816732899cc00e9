//! Guarantees of the task store: task events (updates).

use super::*;

#[tokio::test]
async fn g074_update_keeps_version_and_updated_at() {
    let env = Env::new();
    let store = env.store();
    let r = running(store, "a", Retry).await;
    env.advance(7);
    let (rec, inserted) = store.append_update("a", update(1, "e", "x")).await.unwrap();
    assert!(inserted);
    assert_eq!(rec.created_at, Timestamp(T0 + 7));
    let t = store.get("a").await.unwrap();
    assert_eq!((t.version, t.updated_at), (r.version, r.updated_at));
    assert_eq!(t.updates, 1);
}

#[tokio::test]
async fn g075_update_replay_returns_original() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    let (original, inserted) = store.append_update("a", update(1, "e", "x")).await.unwrap();
    assert!(inserted);
    env.advance(100);
    let (again, inserted) = store.append_update("a", update(1, "e", "x")).await.unwrap();
    assert!(!inserted);
    assert_eq!(again, original);
    assert_eq!(store.get("a").await.unwrap().updates, 1);
}

#[tokio::test]
async fn g076_update_conflict_stores_nothing() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    store.append_update("a", update(1, "e", "x")).await.unwrap();
    let before = store.get("a").await.unwrap();
    assert_err!(
        store.append_update("a", update(1, "e", "y")).await,
        StoreError::EventIdConflict { .. }
    );
    let mut other_kind = update(1, "e", "x");
    other_kind.kind = "other".into();
    assert_err!(
        store.append_update("a", other_kind).await,
        StoreError::EventIdConflict { .. }
    );
    let mut other_meta = update(1, "e", "x");
    other_meta.metadata.clear();
    assert_err!(
        store.append_update("a", other_meta).await,
        StoreError::EventIdConflict { .. }
    );
    assert_eq!(store.get("a").await.unwrap(), before);
    assert_eq!(
        store
            .list_updates("a", None, 0, false)
            .await
            .unwrap()
            .updates
            .len(),
        1
    );
}

#[tokio::test]
async fn g078_updates_in_append_order_and_reversed() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    let ids = ["z", "a", "m", "b", "y"];
    for (i, id) in ids.iter().enumerate() {
        store
            .append_update("a", update(1, id, &i.to_string()))
            .await
            .unwrap();
        if i == 2 {
            ok(store, "a", Command::Heartbeat).await;
        }
    }
    let forward: Vec<_> = store
        .list_updates("a", None, 0, false)
        .await
        .unwrap()
        .updates
        .into_iter()
        .map(|u| u.event_id)
        .collect();
    assert_eq!(forward, ids);
    let backward: Vec<_> = store
        .list_updates("a", None, 0, true)
        .await
        .unwrap()
        .updates
        .into_iter()
        .map(|u| u.event_id)
        .collect();
    let mut reversed: Vec<String> = ids.map(str::to_owned).to_vec();
    reversed.reverse();
    assert_eq!(backward, reversed);
    // Paged, both directions.
    for newest_first in [false, true] {
        let mut cursor = None;
        let mut all = Vec::new();
        loop {
            let page = store
                .list_updates("a", cursor.as_deref(), 2, newest_first)
                .await
                .unwrap();
            assert!(page.updates.len() <= 2);
            all.extend(page.updates.into_iter().map(|u| u.event_id));
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(
            all,
            if newest_first {
                reversed.clone()
            } else {
                ids.map(str::to_owned).to_vec()
            }
        );
    }
}

#[tokio::test]
async fn g079_update_cursor_keeps_its_snapshot() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    for i in 0..3 {
        store
            .append_update("a", update(1, &format!("e{i}"), "x"))
            .await
            .unwrap();
    }
    for newest_first in [false, true] {
        let first = store
            .list_updates("a", None, 2, newest_first)
            .await
            .unwrap();
        let cursor = first.next_cursor.unwrap();
        store
            .append_update("a", update(1, &format!("late{newest_first}"), "x"))
            .await
            .unwrap();
        let rest = store
            .list_updates("a", Some(&cursor), 100, newest_first)
            .await
            .unwrap();
        let ids: Vec<_> = rest.updates.into_iter().map(|u| u.event_id).collect();
        if newest_first {
            // The traversal started after "latefalse" was appended; "latetrue" is not seen.
            assert_eq!(ids, ["e1", "e0"]);
        } else {
            assert_eq!(ids, ["e2"]);
        }
        assert_eq!(rest.next_cursor, None);
    }
}

#[tokio::test]
async fn g080_update_cursor_validation() {
    let env = Env::new();
    let store = env.store();
    for id in ["a", "b"] {
        running(store, id, Retry).await;
        for i in 0..3 {
            store
                .append_update(id, update(1, &format!("e{i}"), "x"))
                .await
                .unwrap();
        }
    }
    let cursor = store
        .list_updates("a", None, 1, false)
        .await
        .unwrap()
        .next_cursor
        .unwrap();
    assert_err!(
        store.list_updates("b", Some(&cursor), 1, false).await,
        StoreError::InvalidCursor { .. }
    );
    assert_err!(
        store.list_updates("a", Some(&cursor), 1, true).await,
        StoreError::InvalidCursor { .. }
    );
    assert_err!(
        store.list_updates("a", Some("garbage"), 1, false).await,
        StoreError::InvalidCursor { .. }
    );
    assert!(store
        .list_updates("a", Some(&cursor), 1, false)
        .await
        .is_ok());
}

#[tokio::test]
async fn g081_updates_of_unknown_task_not_found() {
    let env = Env::new();
    assert_err!(
        env.store().list_updates("nope", None, 0, false).await,
        StoreError::NotFound { .. }
    );
    assert_err!(
        env.store().append_update("nope", update(1, "e", "x")).await,
        StoreError::NotFound { .. }
    );
}

#[tokio::test]
async fn g082_updates_readable_after_terminal_and_retry() {
    let mut env = Env::new();
    running(env.store(), "a", Retry).await;
    env.store()
        .append_update("a", update(1, "first", "x"))
        .await
        .unwrap();
    env.advance(LEASE_MS);
    ok(env.store(), "a", Command::Start).await;
    env.store()
        .append_update("a", update(2, "second", "y"))
        .await
        .unwrap();
    ok(env.store(), "a", Command::Complete { data: vec![] }).await;
    env.reopen();
    let page = env.store().list_updates("a", None, 0, false).await.unwrap();
    let got: Vec<_> = page
        .updates
        .iter()
        .map(|u| (u.event_id.as_str(), u.attempt))
        .collect();
    assert_eq!(got, [("first", 1), ("second", 2)]);
}
