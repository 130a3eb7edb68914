//! When a run's end is worth an OS notification, and what it says: a run that finished,
//! failed or was stopped while the window was not focused. A pause is not an end, and
//! someone looking at the window sees the end there.

use ostinato_engine::run_state::RunStatus;

/// What the run's views tell a notification.
#[derive(Debug, Clone, PartialEq)]
pub struct RunFacts {
    pub status: RunStatus,
    pub steps: u64,
    /// The run's folder name.
    pub name: Option<String>,
    /// Why it failed.
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub title: String,
    pub body: String,
}

/// The notification for the change from `before` to `now`, if one is due: only when the
/// run has just left the engine's hands by finishing, failing or stopping, and the
/// window is not focused.
pub fn notice(before: RunStatus, now: &RunFacts, focused: bool) -> Option<Notice> {
    if focused || !before.is_active() {
        return None;
    }
    let run = now.name.as_deref().map(|n| format!("Run {n}")).unwrap_or_else(|| "The run".into());
    let steps = now.steps;
    let (title, body) = match now.status {
        RunStatus::Finished => ("Training finished", format!("{run} finished after {steps} steps.")),
        RunStatus::Failed => (
            "Training failed",
            format!("{run} failed at step {steps}: {}", now.reason.as_deref().unwrap_or("no reason given")),
        ),
        RunStatus::Stopped => ("Training stopped", format!("{run} stopped at step {steps}; it can be resumed.")),
        _ => return None,
    };
    Some(Notice { title: title.into(), body })
}
