//! Guarantees of the task store: transcript failure.

use super::*;

#[tokio::test]
async fn g066_transcript_failure_first_wins() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    let first = ok(
        store,
        "a",
        Command::ReportTranscriptFailure {
            error: "disk full".into(),
        },
    )
    .await;
    assert_eq!(first.output_file_error, "disk full");
    let again = ok(
        store,
        "a",
        Command::ReportTranscriptFailure {
            error: "other".into(),
        },
    )
    .await;
    assert_eq!(again, first);
    // Allowed with cancel intent; still the first message.
    ok(
        store,
        "a",
        Command::RequestCancel {
            reason: String::new(),
        },
    )
    .await;
    let t = ok(
        store,
        "a",
        Command::ReportTranscriptFailure {
            error: "third".into(),
        },
    )
    .await;
    assert_eq!(t.output_file_error, "disk full");
    running(store, "b", Retry).await;
    ok(
        store,
        "b",
        Command::RequestCancel {
            reason: String::new(),
        },
    )
    .await;
    let t = ok(
        store,
        "b",
        Command::ReportTranscriptFailure { error: "x".into() },
    )
    .await;
    assert_eq!(t.output_file_error, "x");
}

#[tokio::test]
async fn g067_transcript_failure_keeps_status_and_result() {
    let env = Env::new();
    let store = env.store();
    let r = running(store, "a", Retry).await;
    let t = ok(
        store,
        "a",
        Command::ReportTranscriptFailure { error: "e".into() },
    )
    .await;
    assert_eq!(
        (t.status, &t.result_data, &t.result_error),
        (r.status, &r.result_data, &r.result_error)
    );
    let done = ok(store, "a", Command::Complete { data: cp("ok") }).await;
    assert_eq!(
        (
            done.status,
            done.result_data.as_slice(),
            done.result_error.as_str()
        ),
        (Status::Completed, &b"ok"[..], "")
    );
    assert_eq!(done.output_file_error, "e");
}
