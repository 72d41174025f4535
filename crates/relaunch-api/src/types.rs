//! The JSON side of the API: runs, their status, events, log lines, series
//! and errors, exactly as they travel.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where a run is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    Running,
    Preempted,
    Restarting,
    Failed,
    Finished,
}

impl RunStatus {
    pub const ALL: [RunStatus; 5] = [
        Self::Running,
        Self::Preempted,
        Self::Restarting,
        Self::Failed,
        Self::Finished,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Preempted => "preempted",
            Self::Restarting => "restarting",
            Self::Failed => "failed",
            Self::Finished => "finished",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// Where a run opened without a project lives until one is named.
pub const DEFAULT_PROJECT: &str = "default";

/// `POST /api/v1/runs`: create a run, or resume it when `id` names one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunInit {
    /// The run's project. Absent: join the run wherever it is, or create it
    /// in [`DEFAULT_PROJECT`] until a caller names a project (the launcher
    /// opens the run before the training script says its project).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// A stable id, the same across relaunches; a new one when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The run's parameters, any JSON (a nested config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
    /// Names one attempt of the run: every process of one attempt sends the
    /// same token and gets the same attempt number; a new token starts the
    /// next attempt.
    pub attempt_token: String,
    /// When the caller's attempt started, in seconds since the Unix epoch
    /// (the earliest any of its processes reports). Reads order attempts by
    /// it: a dead attempt's records may reach the server after the next
    /// attempt's did. The server's clock when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_started: Option<f64>,
}

/// A run as the server has it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub id: String,
    pub project: String,
    pub name: String,
    pub status: RunStatus,
    /// Seconds since the Unix epoch.
    pub created_at: f64,
    pub updated_at: f64,
    /// Attempts started so far; the newest is `attempts - 1`.
    pub attempts: u32,
    /// The attempt the caller's token names (on `POST /runs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    pub tags: Vec<String>,
    pub notes: String,
    pub config: Value,
}

/// `PATCH /api/v1/runs/{id}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RunStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
}

/// `GET /api/v1/runs` filters; all optional and combined with AND.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunFilter {
    #[serde(default)]
    pub project: Option<String>,
    #[serde(default)]
    pub tag: Option<String>,
    #[serde(default)]
    pub status: Option<RunStatus>,
    /// `PATH=VALUE` on the config, `PATH` dotted (`optim.lr=0.1`); values
    /// compare as JSON when they parse as JSON, else as strings. Also
    /// `!=`, and `<`, `<=`, `>`, `>=` with a number.
    #[serde(default)]
    pub param: Vec<String>,
    /// `KEY OP NUMBER` on the run's newest value of metric `KEY` (its
    /// lowest rank), OP one of `=`, `!=`, `<`, `<=`, `>`, `>=`.
    #[serde(default)]
    pub metric: Vec<String>,
    /// Text the run's id, name, project, tags or notes contain, in any case.
    #[serde(default)]
    pub q: Option<String>,
    /// The order: `created` (the default, newest first: `-created`),
    /// `updated`, `name`, `status`, `attempts`, `project`, `config.PATH`
    /// or `summary.KEY`; `-` first for descending. Runs without the value
    /// come last either way.
    #[serde(default)]
    pub sort: Option<String>,
    /// Runs skipped before the first returned, in that order (paging).
    #[serde(default)]
    pub offset: Option<u32>,
    #[serde(default)]
    pub limit: Option<u32>,
}

/// The server's answer to a batch: every record of `writer` up to and
/// including `watermark` is stored, durably, exactly once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    pub writer: String,
    pub watermark: u64,
}

/// Which axis a series is drawn against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Axis {
    #[default]
    Step,
    Wall,
}

/// `GET /api/v1/runs/{id}/series?key=...`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeriesQuery {
    pub key: String,
    /// The rank whose values to read; the lowest rank that logged the key
    /// when absent.
    #[serde(default)]
    pub rank: Option<u32>,
    /// Points wanted at most; more are reduced to buckets keeping each
    /// bucket's min, max, first and last.
    #[serde(default = "default_buckets")]
    pub buckets: u32,
    #[serde(default)]
    pub min_step: Option<i64>,
    #[serde(default)]
    pub max_step: Option<i64>,
    /// Only this attempt's values; by default each step shows the value of
    /// the newest attempt that logged it.
    #[serde(default)]
    pub attempt: Option<u32>,
}

fn default_buckets() -> u32 {
    1000
}

/// `GET /api/v1/runs/{id}/history`: every point of some keys, unsampled, in
/// the column format ([`crate::columns`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistoryQuery {
    /// The keys to read; every key of the run when empty.
    pub keys: Vec<String>,
    /// One rank's points; every rank's when absent.
    pub rank: Option<u32>,
    /// Inclusive step bounds.
    pub min_step: Option<i64>,
    pub max_step: Option<i64>,
    /// Only this attempt's points; by default each step's value from the
    /// newest attempt that logged it (a resumed run's history).
    pub attempt: Option<u32>,
}

impl HistoryQuery {
    /// The query string's pairs (`key` repeated).
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut q: Vec<(&'static str, String)> =
            self.keys.iter().map(|k| ("key", k.clone())).collect();
        if let Some(r) = self.rank {
            q.push(("rank", r.to_string()));
        }
        if let Some(s) = self.min_step {
            q.push(("min_step", s.to_string()));
        }
        if let Some(s) = self.max_step {
            q.push(("max_step", s.to_string()));
        }
        if let Some(a) = self.attempt {
            q.push(("attempt", a.to_string()));
        }
        q
    }

    /// Reads a query string; the error says which parameter is wrong.
    pub fn parse(query: &str) -> Result<Self, String> {
        fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, String> {
            value
                .parse()
                .map_err(|_| format!("{name} {value:?} is not a whole number in range"))
        }
        let mut q = Self::default();
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match k.as_ref() {
                "key" => q.keys.push(v.into_owned()),
                "rank" => q.rank = Some(number("rank", &v)?),
                "min_step" => q.min_step = Some(number("min_step", &v)?),
                "max_step" => q.max_step = Some(number("max_step", &v)?),
                "attempt" => q.attempt = Some(number("attempt", &v)?),
                other => {
                    return Err(format!(
                        "unknown parameter {other:?}; use key (repeated), rank, min_step, max_step, attempt"
                    ));
                }
            }
        }
        Ok(q)
    }
}

/// One point of a series, or one bucket of a downsampled one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeriesPoint {
    /// The step of the bucket's last point (of the point itself when not
    /// downsampled).
    pub step: i64,
    pub wall: f64,
    /// The bucket's last value (NaN included). In JSON, NaN and the
    /// infinities are strings ([`crate::float`]).
    #[serde(with = "crate::float")]
    pub value: f64,
    /// The bucket's extremes, NaN ignored (NaN only when every value in the
    /// bucket is NaN); the infinities count.
    #[serde(with = "crate::float")]
    pub min: f64,
    #[serde(with = "crate::float")]
    pub max: f64,
    /// Points in the bucket.
    pub count: u64,
    pub attempt: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Series {
    pub key: String,
    pub rank: u32,
    /// Points in the range, before downsampling.
    pub total: u64,
    pub downsampled: bool,
    pub points: Vec<SeriesPoint>,
}

/// The newest value of each key (of the newest step).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Latest {
    pub key: String,
    pub rank: u32,
    pub step: i64,
    /// NaN and the infinities as strings in JSON ([`crate::float`]).
    #[serde(with = "crate::float")]
    pub value: f64,
    pub wall: f64,
    pub attempt: u32,
}

/// `GET /api/v1/latest`: the newest value of one key of one run, for a
/// table of many runs (the lowest rank that logged the key, as a series
/// read without `rank` shows).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunLatest {
    pub run: String,
    /// Its fields sit beside `run` in the JSON object.
    #[serde(flatten)]
    pub latest: Latest,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A console line of one rank.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogLine {
    /// Position in the run's log, increasing; `?after=` resumes from it.
    pub id: u64,
    pub rank: u32,
    pub stream: Stream,
    pub attempt: u32,
    pub wall: f64,
    pub text: String,
}

/// Something that happened to a run: start, restart, preemption, failure
/// (with its root cause), finish.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub id: u64,
    pub kind: String,
    pub attempt: u32,
    pub wall: f64,
    pub text: String,
    #[serde(default)]
    pub data: Value,
}

/// What every error response carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// What was wrong and what to do.
    pub error: String,
    /// `bad_request`, `unauthorized`, `not_found`, `conflict`, `too_large`,
    /// `internal`.
    pub kind: String,
}

/// Metadata the server reports at `GET /api/v1/health`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Health {
    pub version: String,
    pub storage: String,
    pub limits: BTreeMap<String, u64>,
}
