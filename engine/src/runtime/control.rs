//! Controls sent to a running attempt: a one-place mailbox where a higher-priority control
//! replaces a queued lower one (Stop > Timeout > Drain) and a lower one never replaces a
//! higher one.

use parking_lot::Mutex;
use tokio::sync::Notify;

/// A control request for a running attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Stop now: cancellation was accepted (the durable reason).
    Stop(String),
    /// The attempt ran out of time (the reason).
    Timeout(String),
    /// Advisory: the manager is closing; checkpoint and yield if you can (the reason).
    Drain(String),
}

/// The reason given to a timeout without one.
pub const DEFAULT_TIMEOUT_REASON: &str = "background task timed out";

impl Control {
    /// The priority: Stop 3, Timeout 2, Drain 1.
    #[must_use]
    pub const fn priority(&self) -> u8 {
        match self {
            Self::Stop(_) => 3,
            Self::Timeout(_) => 2,
            Self::Drain(_) => 1,
        }
    }

    /// The control's reason.
    #[must_use]
    pub fn reason(&self) -> &str {
        match self {
            Self::Stop(r) | Self::Timeout(r) | Self::Drain(r) => r,
        }
    }
}

/// A capacity-one control channel with priority replacement.
#[derive(Debug, Default)]
pub struct ControlSlot {
    queued: Mutex<Option<Control>>,
    notify: Notify,
}

impl ControlSlot {
    /// Queues `control`. Returns whether it was accepted: it replaces a queued control of lower
    /// priority, is accepted as a repeat of an identical one, and is refused when a control of
    /// higher (or equal, different) priority is queued.
    pub fn send(&self, control: Control) -> bool {
        let control = match control {
            Control::Timeout(r) if r.is_empty() => Control::Timeout(DEFAULT_TIMEOUT_REASON.into()),
            other => other,
        };
        let mut queued = self.queued.lock();
        let accepted = match queued.as_ref() {
            None => true,
            Some(q) if *q == control => return true,
            Some(q) => control.priority() > q.priority(),
        };
        if accepted {
            *queued = Some(control);
            drop(queued);
            self.notify.notify_one();
        }
        accepted
    }

    /// Takes the queued control, if any.
    pub fn try_recv(&self) -> Option<Control> {
        self.queued.lock().take()
    }

    /// Waits for the next control.
    pub async fn recv(&self) -> Control {
        loop {
            let notified = self.notify.notified();
            if let Some(control) = self.try_recv() {
                return control;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn higher_priority_replaces_lower_never_the_reverse() {
        let slot = ControlSlot::default();
        assert!(slot.send(Control::Drain("closing".into())));
        assert!(slot.send(Control::Timeout(String::new())));
        assert!(!slot.send(Control::Drain("again".into())));
        assert!(slot.send(Control::Stop("user".into())));
        assert!(!slot.send(Control::Timeout("late".into())));
        assert!(
            slot.send(Control::Stop("user".into())),
            "identical repeat accepted"
        );
        assert_eq!(slot.try_recv(), Some(Control::Stop("user".into())));
        assert_eq!(slot.try_recv(), None);
        assert!(slot.send(Control::Timeout(String::new())));
        assert_eq!(
            slot.try_recv(),
            Some(Control::Timeout(DEFAULT_TIMEOUT_REASON.into()))
        );
    }
}
