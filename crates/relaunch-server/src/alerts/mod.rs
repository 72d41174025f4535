//! Alerts: `relaunch server --webhook URL` posts when a run fails, hangs,
//! is preempted or finishes, when a straggler is named, when training code
//! calls `run.alert(...)`, and when a metric crosses an `--alert` rule.
//!
//! An alert is raised where the batch that carries it is stored, after it
//! is stored and before it is acknowledged: each (alert, webhook) is
//! written to the outbox on disk (`outbox.rs`), so a retried batch raises
//! nothing twice (only records above the writer's old watermark count) and
//! an acknowledged one loses nothing. A task per webhook posts them in
//! order (`deliver.rs`), retrying with backoff for up to a day, and records
//! each delivery, or giving up, as an event of the run. Ingest never waits
//! for a receiver.
//!
//! A metric rule fires once per run, attempt and rule while this server
//! runs (a diverged loss makes one alert, not one per step).

mod config;
mod deliver;
mod outbox;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use relaunch_api::{Batch, Record, RunInfo};
use serde_json::{Value, json};
use tokio::sync::watch;

pub use self::config::{Format, Rule, Webhook};
use self::outbox::{Delivery, Outbox};
use crate::storage::Storage;
use crate::storage::sqlite::Durability;

/// Event kinds that raise an alert, with their level.
const ALERTED: [(&str, Level); 5] = [
    ("failed", Level::Error),
    ("hang", Level::Error),
    ("preempted", Level::Warn),
    ("straggler", Level::Warn),
    ("finished", Level::Info),
];

/// The event kind `run.alert(...)` records.
pub const ALERT_EVENT: &str = "alert";

/// Longest text posted: chat receivers cut or refuse longer messages.
const MAX_TEXT: usize = 3000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    Info,
    Warn,
    Error,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Self::Info => "info",
            Self::Warn => "warn",
            Self::Error => "error",
        }
    }

    fn parse(text: &str) -> Self {
        match text.to_ascii_lowercase().as_str() {
            "error" => Self::Error,
            "info" => Self::Info,
            _ => Self::Warn,
        }
    }

    fn mark(self) -> &'static str {
        match self {
            Self::Info => ":large_green_circle:",
            Self::Warn => ":large_yellow_circle:",
            Self::Error => ":red_circle:",
        }
    }
}

/// What the server was told to post, and where.
#[derive(Clone, Debug, Default)]
pub struct AlertConfig {
    pub webhooks: Vec<Webhook>,
    pub rules: Vec<Rule>,
}

/// The alerts of one server: what raises them, the outbox, and what the
/// delivery tasks share.
#[derive(Debug)]
pub struct Alerts {
    config: AlertConfig,
    outbox: Outbox,
    /// (run, attempt token, rule) that fired.
    fired: Mutex<HashSet<(String, String, usize)>>,
    /// Bumped when a delivery is written: wakes the delivery tasks.
    written: watch::Sender<u64>,
    /// This server's writer id for the events that record deliveries, and
    /// its sequence per run (one writer per process, so replicas never
    /// share a sequence).
    writer: String,
    recorded: Mutex<HashMap<String, u64>>,
    /// Alerts dropped at a full outbox, said once per run of them.
    drops: outbox::Drops,
}

/// One alert, before it is shaped for a webhook.
struct Alert {
    kind: String,
    level: Level,
    title: String,
    text: String,
    wall: f64,
    attempt_token: String,
    /// Fields of the JSON shape beyond the common ones.
    detail: Value,
}

impl Alerts {
    /// The alerts of a server whose data directory is `data_dir` (the
    /// outbox lives in `data_dir/alerts/`).
    pub fn open(
        config: AlertConfig,
        data_dir: &Path,
        durability: Durability,
    ) -> std::io::Result<Arc<Self>> {
        let outbox = Outbox::open(data_dir, durability)?;
        Ok(Arc::new(Self {
            config,
            outbox,
            fired: Mutex::new(HashSet::new()),
            written: watch::channel(0).0,
            writer: format!("relaunch-server-alerts-{}", uuid::Uuid::new_v4().simple()),
            recorded: Mutex::new(HashMap::new()),
            drops: outbox::Drops::default(),
        }))
    }

    pub fn config(&self) -> &AlertConfig {
        &self.config
    }

    /// Whether any record of `batch` could raise an alert: only then does
    /// ingest read the writer's watermark first (most batches are metrics
    /// no rule names).
    pub(crate) fn may_raise(&self, batch: &Batch) -> bool {
        batch.records.iter().any(|(_, record)| match record {
            Record::Metrics { values, .. } => values
                .iter()
                .any(|(key, _)| self.config.rules.iter().any(|r| r.key == *key)),
            Record::Event { kind, .. } => {
                kind == ALERT_EVENT || ALERTED.iter().any(|(k, _)| k == kind)
            }
            Record::Log { .. } => false,
        })
    }

    /// Raises the alerts of `batch`'s records above `old_watermark` (those
    /// just stored in `run`), writing them to the outbox. Runs on a
    /// blocking thread after the batch is stored. Never fails the batch: a
    /// failure to write is logged.
    pub(crate) fn raise(
        &self,
        storage: &dyn Storage,
        run: &str,
        batch: &Batch,
        old_watermark: u64,
    ) {
        let alerts = self.collect(run, batch, old_watermark);
        if alerts.is_empty() {
            return;
        }
        let info = storage.get_run(run).ok();
        for alert in alerts {
            for hook in &self.config.webhooks {
                let delivery = Delivery {
                    url: hook.url.clone(),
                    body: shape(hook.format, &alert, run, info.as_ref()),
                    run: run.to_owned(),
                    attempt_token: alert.attempt_token.clone(),
                    title: alert.title.clone(),
                    raised: alert.wall,
                };
                match self.outbox.put(&delivery) {
                    Ok(true) => {
                        if let Some(n) = self.drops.fit() {
                            tracing::info!(
                                dropped = n,
                                "the alert outbox takes alerts again; {n} were dropped while it \
                                 was full"
                            );
                        }
                    }
                    Ok(false) => {
                        if let Some(total) = self.drops.dropped() {
                            tracing::warn!(
                                run,
                                title = %alert.title,
                                dropped_in_all = total,
                                max = outbox::MAX_PENDING,
                                "alerts are being dropped: the outbox is full of deliveries its \
                                 webhooks have not taken (are they down?); said once until one \
                                 fits again"
                            );
                        }
                    }
                    Err(e) => {
                        tracing::error!(run, error = %e, "cannot write an alert to the outbox")
                    }
                }
            }
        }
        self.written.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn collect(&self, run: &str, batch: &Batch, old_watermark: u64) -> Vec<Alert> {
        let mut out = Vec::new();
        for (seq, record) in &batch.records {
            if *seq <= old_watermark {
                continue;
            }
            match record {
                Record::Metrics {
                    step,
                    wall,
                    rank,
                    values,
                } => {
                    for (index, rule) in self.config.rules.iter().enumerate() {
                        let Some((_, value)) = values
                            .iter()
                            .find(|(key, value)| *key == rule.key && rule.fires(*value))
                        else {
                            continue;
                        };
                        let first = self.fired.lock().insert((
                            run.to_owned(),
                            batch.attempt_token.clone(),
                            index,
                        ));
                        if first {
                            out.push(Alert {
                                kind: "metric".into(),
                                level: Level::Warn,
                                title: format!("{rule}"),
                                text: format!(
                                    "{} = {} at step {step} (rank {rank})",
                                    rule.key,
                                    shown_value(*value)
                                ),
                                wall: *wall,
                                attempt_token: batch.attempt_token.clone(),
                                detail: json!({
                                    "rule": rule.to_string(),
                                    "key": rule.key,
                                    "value": shown_value(*value),
                                    "step": step,
                                    "rank": rank,
                                }),
                            });
                        }
                    }
                }
                Record::Event {
                    kind,
                    wall,
                    text,
                    data,
                } => {
                    let data: Value = serde_json::from_str(data).unwrap_or(Value::Null);
                    let (level, title) = if kind == ALERT_EVENT {
                        let level = Level::parse(data["level"].as_str().unwrap_or("warn"));
                        let title = data["title"].as_str().unwrap_or("alert").to_owned();
                        (level, title)
                    } else if let Some((_, level)) = ALERTED.iter().find(|(k, _)| k == kind) {
                        (*level, kind.replace('_', " "))
                    } else {
                        continue;
                    };
                    out.push(Alert {
                        kind: kind.clone(),
                        level,
                        title,
                        text: text.clone(),
                        wall: *wall,
                        attempt_token: batch.attempt_token.clone(),
                        detail: json!({ "data": data }),
                    });
                }
                Record::Log { .. } => {}
            }
        }
        out
    }

    /// Records `text` as an event of `run` (kind `alert_sent` or
    /// `alert_failed`), in the attempt that raised the alert.
    fn record(&self, storage: &dyn Storage, delivery: &Delivery, kind: &str, text: String) {
        // One at a time, so that this writer's sequence reaches storage in order.
        let mut recorded = self.recorded.lock();
        let seq = recorded.get(&delivery.run).copied().unwrap_or(0) + 1;
        let batch = Batch {
            writer: self.writer.clone(),
            attempt_token: delivery.attempt_token.clone(),
            records: vec![(
                seq,
                Record::Event {
                    kind: kind.into(),
                    wall: crate::api::now(),
                    text,
                    data: json!({ "title": delivery.title }).to_string(),
                },
            )],
        };
        match storage.ingest(&delivery.run, &batch, crate::api::now()) {
            Ok(_) => {
                recorded.insert(delivery.run.clone(), seq);
            }
            Err(e) => {
                tracing::warn!(run = %delivery.run, error = %e, "cannot record an alert's delivery")
            }
        }
    }
}

/// A value as JSON can carry it: NaN and the infinities as strings.
fn shown_value(value: f64) -> Value {
    if value.is_finite() {
        json!(value)
    } else if value.is_nan() {
        json!("NaN")
    } else if value > 0.0 {
        json!("Infinity")
    } else {
        json!("-Infinity")
    }
}

fn cut(text: &str) -> String {
    if text.len() <= MAX_TEXT {
        return text.to_owned();
    }
    let mut end = MAX_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// `text` as Slack shows it and nothing more: its control sequences
/// (`<!channel>`, `<URL|link>`, `<@USER>`) need `<` and `>`, and `&` starts
/// an escape, so those three are escaped as Slack's docs say.
fn slack_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `text` for inside a ``` block: escaped, and no two backticks side by
/// side, nor one next to the fences (a zero-width space between), so that
/// nothing in it closes the block.
fn slack_code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last = '`'; // the opening fence's
    for c in slack_escape(text).chars() {
        if c == '`' && last == '`' {
            out.push('\u{200b}');
        }
        out.push(c);
        last = c;
    }
    if last == '`' {
        out.push('\u{200b}');
    }
    out
}

/// The body posted to a webhook of `format`.
fn shape(format: Format, alert: &Alert, run: &str, info: Option<&RunInfo>) -> Value {
    let project = info.map_or("", |i| i.project.as_str());
    let name = info.map_or("", |i| i.name.as_str());
    let shown = if project.is_empty() {
        run.to_owned()
    } else {
        format!("{project}/{run}")
    };
    match format {
        Format::Slack => {
            let mut text = format!(
                "{} *{}* in run `{}`",
                alert.level.mark(),
                slack_escape(&alert.title),
                slack_escape(&shown).replace('`', "'"),
            );
            if !alert.text.is_empty() {
                text.push_str("\n```");
                text.push_str(&slack_code(&cut(&alert.text)));
                text.push_str("```");
            }
            json!({ "text": text })
        }
        Format::Json => {
            let mut body = json!({
                "source": "relaunch",
                "kind": alert.kind,
                "level": alert.level.as_str(),
                "title": alert.title,
                "text": cut(&alert.text),
                "run": run,
                "project": project,
                "name": name,
                "wall": alert.wall,
            });
            if let (Some(body), Some(detail)) = (body.as_object_mut(), alert.detail.as_object()) {
                for (k, v) in detail {
                    body.insert(k.clone(), v.clone());
                }
            }
            body
        }
    }
}

pub(crate) use self::deliver::spawn as spawn_delivery;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slack_shows_client_text_as_text() {
        // Issue 35: a title and text from a client went into Slack's
        // message as they were: `<!channel>` pinged everyone, a link was
        // live, and text after a closing ``` was markup again.
        let alert = Alert {
            kind: "alert".into(),
            level: Level::Warn,
            title: "<!channel> loss & <http://evil.example|docs>".into(),
            text: "a```<!here> b ``` `c`".into(),
            wall: 0.0,
            attempt_token: String::new(),
            detail: Value::Null,
        };
        let body = shape(Format::Slack, &alert, "run`1", None);
        let text = body["text"].as_str().unwrap_or_default();
        for live in ["<!channel>", "<!here>", "<http", "run`1"] {
            assert!(!text.contains(live), "{live} in {text}");
        }
        assert!(text.contains("&lt;!channel&gt; loss &amp; &lt;http://evil.example|docs&gt;"));
        assert_eq!(text.matches("```").count(), 2, "{text}");
        assert!(text.ends_with("`c`\u{200b}```"), "{text}");
    }
}
