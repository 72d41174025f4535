//! `relaunch runs ls` and `relaunch runs show`: the runs a tracking server
//! holds, as a table or JSON.

use anyhow::Context as _;
use relaunch_api::{Event, Latest, RunFilter, RunInfo};
use relaunch_client::system::step_is_wall_millis;

use crate::cli::{ListFormat, RunsLsArgs, RunsShowArgs, ShowFormat};
use crate::render::{age, now, number, table, utc};
use crate::{output, tracking};

pub(crate) fn ls(args: &RunsLsArgs) -> anyhow::Result<u8> {
    let client = tracking::connect(&args.connection)?;
    let filter = RunFilter {
        project: args.project.clone(),
        tag: args.tag.clone(),
        status: args.status.map(Into::into),
        param: args.param.clone(),
        metric: args.metric.clone(),
        q: args.search.clone(),
        sort: args.sort.clone(),
        offset: args.offset,
        limit: args.limit,
    };
    let runs = tracking::block_on(client.list_runs(&filter))?
        .map_err(|e| tracking::explain(e, &client, None))?;
    let text = match args.format {
        ListFormat::Table => {
            if runs.is_empty() {
                output::status(&format!("no runs on {} match", client.url()));
            }
            runs_table(&runs, now())
        }
        ListFormat::Json => json(&runs)?,
    };
    output::data(&text)?;
    Ok(0)
}

fn runs_table(runs: &[RunInfo], now: f64) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                r.id.clone(),
                r.project.clone(),
                r.name.clone(),
                r.status.as_str().to_owned(),
                r.attempts.to_string(),
                age(r.updated_at, now),
            ]
        })
        .collect();
    table(
        &["ID", "PROJECT", "NAME", "STATUS", "ATTEMPTS", "UPDATED"],
        &rows,
    )
}

pub(crate) fn show(args: &RunsShowArgs) -> anyhow::Result<u8> {
    let client = tracking::connect(&args.connection)?;
    let run = args.run.as_str();
    let (info, latest, events) = tracking::block_on(async {
        // The run first: its absence is the clearest message.
        let info = client.get_run(run).await?;
        let (latest, events) = tokio::try_join!(client.latest(run), client.events(run))?;
        Ok((info, latest, events))
    })?
    .map_err(|e| tracking::explain(e, &client, Some(run)))?;
    let text = match args.format {
        ShowFormat::Text => show_text(&info, &latest, &events),
        ShowFormat::Json => json(&serde_json::json!({
            "run": info,
            "latest": latest,
            "events": events,
        }))?,
    };
    output::data(&text)?;
    Ok(0)
}

fn show_text(run: &RunInfo, latest: &[Latest], events: &[Event]) -> String {
    let mut fields = vec![
        ("id", run.id.clone()),
        ("project", run.project.clone()),
        ("name", run.name.clone()),
        ("status", run.status.as_str().to_owned()),
        ("attempts", run.attempts.to_string()),
        ("created", utc(run.created_at)),
        ("updated", utc(run.updated_at)),
        ("tags", run.tags.join(", ")),
    ];
    if !run.notes.is_empty() {
        fields.push(("notes", run.notes.clone()));
    }
    let mut s = String::new();
    for (name, value) in fields {
        s.push_str(format!("{:<9} {value}", format!("{name}:")).trim_end());
        s.push('\n');
    }
    s.push_str("config:");
    if run.config.is_null() || run.config == serde_json::json!({}) {
        s.push_str(" none\n");
    } else {
        s.push('\n');
        let pretty = serde_json::to_string_pretty(&run.config).unwrap_or_default();
        for line in pretty.lines() {
            s.push_str("  ");
            s.push_str(line);
            s.push('\n');
        }
    }

    s.push_str("\nmetrics (latest value per key and rank):\n");
    if latest.is_empty() {
        s.push_str("  none logged\n");
    } else {
        let rows: Vec<Vec<String>> = latest
            .iter()
            .map(|l| {
                // System metrics are logged at the wall clock's milliseconds.
                let step = if step_is_wall_millis(&l.key) {
                    utc(l.step as f64 / 1000.0)
                } else {
                    l.step.to_string()
                };
                vec![
                    l.key.clone(),
                    l.rank.to_string(),
                    step,
                    l.attempt.to_string(),
                    number(l.value),
                ]
            })
            .collect();
        s.push_str(&table(&["KEY", "RANK", "STEP", "ATTEMPT", "VALUE"], &rows));
    }

    s.push_str("\nevents:\n");
    if events.is_empty() {
        s.push_str("  none recorded\n");
    } else {
        let rows: Vec<Vec<String>> = events
            .iter()
            .map(|e| {
                vec![
                    utc(e.wall),
                    e.attempt.to_string(),
                    e.kind.clone(),
                    e.text.clone(),
                ]
            })
            .collect();
        s.push_str(&table(&["TIME", "ATTEMPT", "KIND", "TEXT"], &rows));
    }
    s
}

fn json<T: serde::Serialize>(value: &T) -> anyhow::Result<String> {
    let mut text = serde_json::to_string_pretty(value).context("cannot write JSON")?;
    text.push('\n');
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use relaunch_api::RunStatus;

    fn run() -> RunInfo {
        RunInfo {
            id: "r1".into(),
            project: "demo".into(),
            name: "first try".into(),
            status: RunStatus::Failed,
            created_at: 1_718_454_896.0,
            updated_at: 1_718_454_956.0,
            attempts: 2,
            attempt: None,
            tags: vec!["a".into(), "b".into()],
            notes: String::new(),
            config: serde_json::json!({"lr": 0.1}),
        }
    }

    #[test]
    fn the_table_has_one_row_per_run() {
        let text = runs_table(&[run()], 1_718_455_136.0);
        assert_eq!(
            text,
            "ID  PROJECT  NAME       STATUS  ATTEMPTS  UPDATED\n\
             r1  demo     first try  failed  2         3m ago\n"
        );
    }

    #[test]
    fn show_lists_settings_metrics_and_events_with_root_causes() {
        // Regression: a system metric's STEP showed its wall-clock
        // milliseconds (1,718,454,956,000) instead of a time.
        let latest = [
            Latest {
                key: "loss".into(),
                rank: 1,
                step: 9,
                value: 0.25,
                wall: 0.0,
                attempt: 1,
            },
            Latest {
                key: "system/load1".into(),
                rank: 0,
                step: 1_718_454_956_000,
                value: 2.5,
                wall: 1_718_454_956.0,
                attempt: 1,
            },
        ];
        let events = [Event {
            id: 1,
            kind: "failed".into(),
            attempt: 1,
            wall: 1_718_454_956.0,
            text: "rank 1 failed\nRuntimeError: boom".into(),
            data: serde_json::Value::Null,
        }];
        insta::assert_snapshot!(show_text(&run(), &latest, &events), @r#"
        id:       r1
        project:  demo
        name:     first try
        status:   failed
        attempts: 2
        created:  2024-06-15T12:34:56Z
        updated:  2024-06-15T12:35:56Z
        tags:     a, b
        config:
          {
            "lr": 0.1
          }

        metrics (latest value per key and rank):
        KEY           RANK  STEP                  ATTEMPT  VALUE
        loss          1     9                     1        0.25
        system/load1  0     2024-06-15T12:35:56Z  1        2.5

        events:
        TIME                  ATTEMPT  KIND    TEXT
        2024-06-15T12:35:56Z  1        failed  rank 1 failed
                                               RuntimeError: boom
        "#);
    }
}
