//! Guarantees of the task store: listing.

use super::*;

#[tokio::test]
async fn g068_list_ascending_and_filtered() {
    let env = Env::new();
    let store = env.store();
    for id in ["c", "a", "d", "b"] {
        create(store, id, Retry).await;
    }
    let mut other = spec("aa");
    other.executor_key = "other".into();
    store.create(request(other, Retry)).await.unwrap();
    let ids = |page: dtask_engine::TaskPage| -> Vec<String> {
        page.tasks.into_iter().map(|t| t.spec.id.clone()).collect()
    };
    assert_eq!(
        ids(store.list_pending(&keys(), None, 0).await.unwrap()),
        ["a", "b", "c", "d"]
    );
    assert_eq!(
        ids(store
            .list_pending(&["other".into()], None, 0)
            .await
            .unwrap()),
        ["aa"]
    );
    assert_eq!(
        ids(store
            .list_pending(&["other".into(), KEY.into()], None, 0)
            .await
            .unwrap()),
        ["a", "aa", "b", "c", "d"]
    );
    assert!(store
        .list_pending(&["none".into()], None, 0)
        .await
        .unwrap()
        .tasks
        .is_empty());
}

#[tokio::test]
async fn g069_list_rejects_empty_keys() {
    let env = Env::new();
    let store = env.store();
    create(store, "a", Retry).await;
    assert_err!(
        store.list_pending(&[], None, 0).await,
        StoreError::Invalid { .. }
    );
    assert_err!(
        store
            .list_pending(&[KEY.into(), String::new()], None, 0)
            .await,
        StoreError::Invalid { .. }
    );
    assert_err!(
        store.list_suspended(&[], None, 0).await,
        StoreError::Invalid { .. }
    );
}

#[tokio::test]
async fn g070_list_pagination() {
    let env = Env::new();
    let store = env.store();
    for id in ["b", "a", "c"] {
        create(store, id, Retry).await;
    }
    let first = store.list_pending(&keys(), None, 2).await.unwrap();
    let ids: Vec<_> = first.tasks.iter().map(|t| t.spec.id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    let cursor = first.next_cursor.expect("a cursor");
    let next = store.list_pending(&keys(), Some(&cursor), 2).await.unwrap();
    let ids: Vec<_> = next.tasks.iter().map(|t| t.spec.id.as_str()).collect();
    assert_eq!(ids, ["c"]);
    assert_eq!(next.next_cursor, None);
    // An exactly full last page has no cursor either.
    let all = store.list_pending(&keys(), None, 3).await.unwrap();
    assert_eq!((all.tasks.len(), all.next_cursor), (3, None));
}

#[tokio::test]
async fn g071_list_cursor_of_another_listing() {
    let env = Env::new();
    let store = env.store();
    for id in ["a", "b", "c"] {
        create(store, id, Retry).await;
    }
    let cursor = store
        .list_pending(&keys(), None, 1)
        .await
        .unwrap()
        .next_cursor
        .unwrap();
    assert_err!(
        store.list_suspended(&keys(), Some(&cursor), 1).await,
        StoreError::InvalidCursor { .. }
    );
    assert_err!(
        store
            .list_pending(&["other".into()], Some(&cursor), 1)
            .await,
        StoreError::InvalidCursor { .. }
    );
    assert_err!(
        store
            .list_pending(&[KEY.into(), "x".into()], Some(&cursor), 1)
            .await,
        StoreError::InvalidCursor { .. }
    );
    // Key order and duplicates do not matter, neither in the listing that made the cursor
    // nor in the one that goes on from it.
    assert!(store
        .list_pending(&[KEY.into(), KEY.into()], Some(&cursor), 1)
        .await
        .is_ok());
    let unsorted = store
        .list_pending(&["x".into(), KEY.into(), "x".into()], None, 1)
        .await
        .unwrap()
        .next_cursor
        .unwrap();
    let next = store
        .list_pending(&[KEY.into(), "x".into()], Some(&unsorted), 1)
        .await
        .unwrap();
    assert_eq!(next.tasks[0].spec.id, "b");
    assert_err!(
        store.list_pending(&keys(), Some(&unsorted), 1).await,
        StoreError::InvalidCursor { .. }
    );
}

#[tokio::test]
async fn g072_list_malformed_cursor() {
    let env = Env::new();
    let store = env.store();
    create(store, "a", Retry).await;
    for bad in ["", "!!!", "e30", "not-a-cursor", "eyJ2IjoyfQ"] {
        assert_err!(
            store.list_pending(&keys(), Some(bad), 1).await,
            StoreError::InvalidCursor { .. }
        );
    }
}

#[tokio::test]
async fn g073_list_limit_default_and_cap() {
    let env = Env::new();
    let store = env.store();
    for i in 0..1001 {
        create(store, &format!("t{i:04}"), Retry).await;
    }
    for limit in [0, -5] {
        let page = store.list_pending(&keys(), None, limit).await.unwrap();
        assert_eq!(page.tasks.len(), 100);
        assert!(page.next_cursor.is_some());
    }
    let page = store.list_pending(&keys(), None, 5000).await.unwrap();
    assert_eq!(page.tasks.len(), 1000);
    let rest = store
        .list_pending(&keys(), page.next_cursor.as_deref(), 5000)
        .await
        .unwrap();
    assert_eq!(rest.tasks.len(), 1);
    assert_eq!(rest.next_cursor, None);
}
