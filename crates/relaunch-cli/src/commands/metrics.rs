//! `relaunch metrics RUN KEY`: one series of a run, as CSV or JSON.

use anyhow::{Context as _, anyhow};
use relaunch_api::{Series, SeriesQuery};
use relaunch_client::{Client, ErrorKind};

use crate::cli::{MetricsArgs, MetricsFormat};
use crate::render::number;
use crate::{output, tracking};

pub(crate) fn run(args: &MetricsArgs) -> anyhow::Result<u8> {
    check_step_range(args.min_step, args.max_step)?;
    let client = tracking::connect(&args.connection)?;
    let query = SeriesQuery {
        key: args.key.clone(),
        rank: args.rank,
        buckets: args.buckets,
        min_step: args.min_step,
        max_step: args.max_step,
        attempt: args.attempt,
    };
    let series = tracking::block_on(async {
        match client.series(&args.run, &query).await {
            Ok(series) => Ok(series),
            Err(e) if e.kind() == ErrorKind::NotFound => Err(not_found(&client, args).await),
            Err(e) => Err(tracking::explain(e, &client, Some(&args.run))),
        }
    })??;
    let text = match args.format {
        MetricsFormat::Csv => csv(&series),
        MetricsFormat::Json => {
            let mut text = serde_json::to_string_pretty(&series).context("cannot write JSON")?;
            text.push('\n');
            text
        }
    };
    output::data(&text)?;
    Ok(0)
}

/// `--min-step` above `--max-step` selects nothing: say so rather than
/// print an empty table.
pub(crate) fn check_step_range(min: Option<i64>, max: Option<i64>) -> anyhow::Result<()> {
    if let (Some(min), Some(max)) = (min, max)
        && min > max
    {
        anyhow::bail!(
            "--min-step {min} is above --max-step {max}, so no step is in range; swap them"
        );
    }
    Ok(())
}

/// A 404 on a series means no such run or no such key: say which, and list
/// the keys the run has.
async fn not_found(client: &Client, args: &MetricsArgs) -> anyhow::Error {
    match client.keys(&args.run).await {
        Ok(keys) if keys.is_empty() => anyhow!(
            "run {:?} has no metric {:?}: it has logged none yet",
            args.run,
            args.key
        ),
        Ok(keys) => anyhow!(
            "run {:?} has no metric {:?}; its metrics: {}",
            args.run,
            args.key,
            keys.join(", ")
        ),
        Err(e) if e.kind() == ErrorKind::NotFound => tracking::run_not_found(client, &args.run),
        Err(e) => tracking::explain(e, client, Some(&args.run)),
    }
}

/// A value as CSV writes it: `nan`, `inf` and `-inf` for the non-finite
/// ones (what pandas and numpy read back as themselves).
fn csv_value(value: f64) -> String {
    if value.is_nan() {
        "nan".into()
    } else {
        number(value)
    }
}

/// `step,value,wall,attempt`, and `min,max,count` after them when the
/// series came back downsampled (one row per bucket).
fn csv(series: &Series) -> String {
    let mut s = String::from("step,value,wall,attempt");
    if series.downsampled {
        s.push_str(",min,max,count");
    }
    s.push('\n');
    for p in &series.points {
        s.push_str(&format!(
            "{},{},{},{}",
            p.step,
            csv_value(p.value),
            p.wall,
            p.attempt
        ));
        if series.downsampled {
            s.push_str(&format!(
                ",{},{},{}",
                csv_value(p.min),
                csv_value(p.max),
                p.count
            ));
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use relaunch_api::SeriesPoint;

    fn series(downsampled: bool) -> Series {
        Series {
            key: "loss".into(),
            rank: 0,
            total: if downsampled { 20 } else { 2 },
            downsampled,
            points: vec![
                SeriesPoint {
                    step: 4,
                    wall: 1_700_000_000.5,
                    value: 0.5,
                    min: 0.25,
                    max: 1.0,
                    count: 10,
                    attempt: 0,
                },
                SeriesPoint {
                    step: 9,
                    wall: 1_700_000_001.25,
                    value: 1e-9,
                    min: 1e-9,
                    max: 0.2,
                    count: 10,
                    attempt: 1,
                },
            ],
        }
    }

    #[test]
    fn non_finite_values_are_nan_inf_and_minus_inf() {
        let mut s = series(true);
        s.points[0].value = f64::NAN;
        s.points[0].min = f64::NEG_INFINITY;
        s.points[0].max = f64::INFINITY;
        assert_eq!(
            csv(&s).lines().nth(1).unwrap(),
            "4,nan,1700000000.5,0,-inf,inf,10"
        );
    }

    #[test]
    fn csv_has_bucket_columns_only_when_downsampled() {
        assert_eq!(
            csv(&series(false)),
            "step,value,wall,attempt\n4,0.5,1700000000.5,0\n9,1e-9,1700000001.25,1\n"
        );
        assert_eq!(
            csv(&series(true)),
            "step,value,wall,attempt,min,max,count\n\
             4,0.5,1700000000.5,0,0.25,1,10\n\
             9,1e-9,1700000001.25,1,1e-9,0.2,10\n"
        );
    }
}
