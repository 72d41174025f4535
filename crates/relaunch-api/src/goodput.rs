//! `GET /api/v1/runs/{id}/goodput`: where a run's wall time went, per
//! attempt (start-up, productive steps, steps a later attempt redid, the
//! stop, the restart) and per interruption, from its lifecycle events and
//! the times its metric points were logged.
//!
//! Times (`start`, `end`, `*_at`) are seconds since the Unix epoch;
//! durations (`*_s`) are seconds. An attempt's five durations follow one
//! another without gaps, and the attempts' follow one another too, so they
//! add up to `wall_s`.

use serde::{Deserialize, Serialize};

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttemptEnd {
    /// Its workers failed (or the members changed) and the launcher
    /// restarted them: a `restart` event.
    Restart,
    /// `finished`: the job ended well.
    Finished,
    /// `failed`: no restart was left.
    Failed,
    /// `preempted`: a signal stopped the job (a relaunch continues it).
    Preempted,
    /// No end yet: `end` is the server's `now`.
    Running,
    /// A newer attempt started and this one's end was never recorded (its
    /// launcher was killed): it ends at its last step (or its start).
    Unknown,
}

impl AttemptEnd {
    pub const ALL: [AttemptEnd; 6] = [
        Self::Restart,
        Self::Finished,
        Self::Failed,
        Self::Preempted,
        Self::Running,
        Self::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Restart => "restart",
            Self::Finished => "finished",
            Self::Failed => "failed",
            Self::Preempted => "preempted",
            Self::Running => "running",
            Self::Unknown => "unknown",
        }
    }

    /// The event kind that ends an attempt this way, if one does.
    pub fn of_event(kind: &str) -> Option<Self> {
        Some(match kind {
            "restart" => Self::Restart,
            "finished" => Self::Finished,
            "failed" => Self::Failed,
            "preempted" => Self::Preempted,
            _ => return None,
        })
    }
}

/// A run's goodput: productive time over wall time, and where the rest went.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Goodput {
    pub run: String,
    /// The server's clock when it answered: the end of what still runs.
    pub now: f64,
    /// An attempt still runs, or a restart is under way: `wall_s` grows.
    pub running: bool,
    /// The first attempt's start; null when the run has no attempt.
    pub started: Option<f64>,
    /// The last attempt's end (`now` while running); null with no attempt.
    pub ended: Option<f64>,
    /// From the first attempt's start to the last one's end, in seconds.
    pub wall_s: f64,
    /// Seconds spent on steps no later attempt redid.
    pub productive_s: f64,
    /// `productive_s / wall_s`, from 0 to 1; null when no step was ever
    /// logged (a run with events only: unknown, not 0).
    pub goodput: Option<f64>,
    /// Seconds from attempts' starts to their first steps (all of an
    /// attempt that never reached a step).
    pub startup_s: f64,
    /// Seconds spent on steps a later attempt did again.
    pub rerun_s: f64,
    /// Seconds from attempts' last steps to their ends.
    pub stop_s: f64,
    /// Seconds from attempts' ends to the next attempts' starts (a restart's
    /// pause, a relaunch's wait in a queue).
    pub restart_s: f64,
    /// Steps logged that a later attempt logged again.
    pub steps_re_run: u64,
    /// Every attempt, in the order they started.
    pub attempts: Vec<AttemptGoodput>,
    /// Every attempt that a next one followed (or will: a restart under
    /// way), with what it cost.
    pub interruptions: Vec<Interruption>,
}

/// One attempt's time, split into what follows one another: start-up,
/// productive, re-run, stop, restart.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttemptGoodput {
    /// The run's attempt number, as metric points and events carry it.
    pub attempt: u32,
    /// Which launch of the job it belongs to, from 0 in order: a job
    /// relaunched with the same run id (after a preemption) is the next.
    pub launch: u32,
    /// The launcher's own attempt number within its launch (0, then one
    /// more per restart); null for an attempt no launcher started.
    pub launch_attempt: Option<u32>,
    /// Its `start` event (else when its first process opened the run).
    pub start: f64,
    /// When it logged its first step (the earliest over every rank and
    /// key); null when it never logged one.
    pub first_step_at: Option<f64>,
    /// When it logged the last step that no later attempt redid; null when
    /// it logged none such.
    pub kept_step_at: Option<f64>,
    /// When it logged its last step.
    pub last_step_at: Option<f64>,
    /// Its end: its `restart` or end event, `now` while it runs.
    pub end: f64,
    pub ended: AttemptEnd,
    /// The lowest and highest step it logged.
    pub first_step: Option<i64>,
    pub last_step: Option<i64>,
    /// The step a later attempt resumed from, when that redid some of this
    /// attempt's steps: they are re-run from there on.
    pub redone_from: Option<i64>,
    /// Time to start: its start to its first step (its whole time when it
    /// never reached one).
    pub startup_s: f64,
    /// Its first step to its last step no later attempt redid.
    pub productive_s: f64,
    /// Its last kept step to its last step: time on steps redone later.
    pub rerun_s: f64,
    /// Its last step to its end.
    pub stop_s: f64,
    /// Its end to the next attempt's start (to `now` while a restart is
    /// under way); 0 for the last attempt otherwise.
    pub restart_s: f64,
    /// How many of its steps a later attempt logged again.
    pub steps_re_run: u64,
}

/// What one interruption cost: the interrupted attempt's re-run steps and
/// stop, the restart, and the next attempt's start-up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Interruption {
    /// The attempt interrupted.
    pub attempt: u32,
    pub reason: AttemptEnd,
    /// When it ended.
    pub at: f64,
    pub rerun_s: f64,
    pub steps_re_run: u64,
    pub stop_s: f64,
    pub restart_s: f64,
    /// The next attempt's time to start (0 while it has not started).
    pub startup_s: f64,
    /// `rerun_s + stop_s + restart_s + startup_s`.
    pub lost_s: f64,
}
