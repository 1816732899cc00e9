//! The OpenAPI document, generated from the handlers' annotations and the body types. The
//! committed copy, `docs/openapi.json`, is checked against it by a test (`DTASK_BLESS=1`
//! rewrites it).

use super::error::{ErrorBody, ErrorDetail};
use super::model;
use super::{api, health};
use crate::conversation;
use utoipa::OpenApi;

/// The API's description.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "dtask serve",
        description = "The HTTP API of `dtask serve`: tasks folded from a dtask journal, their \
                       records, time travel, control (owner mode), the audit, statistics and \
                       live streams of committed records. See docs/server.md.",
        license(name = "Apache-2.0")
    ),
    paths(
        api::list_tasks,
        api::get_task,
        api::get_records,
        api::get_state,
        api::get_updates,
        api::get_conversation,
        api::submit,
        api::cancel,
        api::resume,
        api::send_input,
        api::send_message,
        api::close_run,
        api::release,
        api::rerun,
        api::purge_task,
        api::hold_task,
        api::lift_hold,
        api::trim_task,
        api::receive_notifications,
        api::ack_notification,
        api::verify,
        api::stats,
        api::stream,
        api::task_stream,
        api::metrics,
        api::openapi,
        health::live,
        health::ready,
    ),
    components(schemas(
        ErrorBody,
        ErrorDetail,
        model::Bytes,
        model::TaskSummary,
        model::TaskList,
        model::TaskStateView,
        model::TaskDetail,
        model::RecordView,
        model::DamagedRecord,
        model::RecordPage,
        model::AtRecord,
        model::StateAt,
        model::MetadataPair,
        model::UpdateView,
        model::UpdatePage,
        conversation::ConversationView,
        conversation::TurnView,
        conversation::CallView,
        conversation::CallResultView,
        conversation::SentMessageView,
        conversation::UsageView,
        model::SubmitBody,
        model::CancelBody,
        model::ResumeBody,
        model::InputBody,
        model::InputView,
        model::MessageBody,
        model::ReleaseBody,
        model::RerunBody,
        model::PurgeView,
        model::HoldBody,
        model::TrimBody,
        model::TrimView,
        model::ReceiveBody,
        model::NotificationView,
        model::NotificationBatch,
        model::AckBody,
        model::AckView,
        model::PurgedStreamView,
        model::ProblemView,
        model::VerifyReport,
        model::Stats,
        model::StorageView,
        model::SyncPromiseView,
        model::SpaceView,
        model::Health,
        model::HealthStatus,
        model::HealthReason,
    )),
    tags(
        (name = "tasks", description = "Tasks folded from the journal, their records and updates"),
        (name = "control", description = "Writes (owner mode only)"),
        (name = "notifications", description = "The notification outbox: lease and acknowledge (owner mode only)"),
        (name = "journal", description = "The audit, statistics, metrics, this document"),
        (name = "streams", description = "Server-sent events of committed records"),
        (name = "health", description = "Liveness and readiness (no token needed)"),
    )
)]
pub struct ApiDoc;

/// The document as pretty JSON, with a final newline.
pub fn document() -> String {
    let mut text = ApiDoc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()));
    text.push('\n');
    text
}
