//! `relaunch export RUN...`: every point of some runs' metrics, unsampled,
//! as CSV (written as it is converted) or Parquet (a row group per million
//! points), read in the server's column format (`GET /runs/{id}/history`),
//! to stdout or to a file that appears only once written whole.

use std::io::{IsTerminal as _, Write};
use std::sync::Arc;

use anyhow::{Context as _, anyhow, bail};
use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int32Type, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use relaunch_api::HistoryQuery;
use relaunch_api::columns::{self, Columns};
use relaunch_client::ErrorKind;

use crate::cli::{ExportArgs, ExportFormat};
use crate::render::number;
use crate::tracking;

pub(crate) fn run(args: &ExportArgs) -> anyhow::Result<u8> {
    super::metrics::check_step_range(args.min_step, args.max_step)?;
    if args.format == ExportFormat::Parquet
        && args.output.is_none()
        && std::io::stdout().is_terminal()
    {
        bail!(
            "Parquet is binary and stdout is a terminal: give --output FILE, or redirect stdout \
             (> runs.parquet)"
        );
    }
    let client = tracking::connect(&args.connection)?;
    let query = HistoryQuery {
        keys: args.keys.clone(),
        rank: args.rank,
        min_step: args.min_step,
        max_step: args.max_step,
        attempt: args.attempt,
    };
    // A file is written beside its name and renamed once whole.
    let target = args.output.as_ref().map(|path| {
        let mut partial = path.clone().into_os_string();
        partial.push(".partial");
        (path.clone(), std::path::PathBuf::from(partial))
    });
    let out: Box<dyn Write + Send> = match &target {
        Some((_, partial)) => Box::new(
            std::fs::File::create(partial)
                .with_context(|| format!("cannot create {}", partial.display()))?,
        ),
        None => Box::new(std::io::stdout()),
    };
    let out = std::io::BufWriter::with_capacity(1 << 20, out);
    let mut sink: Box<dyn Sink> = match args.format {
        ExportFormat::Csv => Box::new(Csv::new(out)),
        ExportFormat::Parquet => Box::new(Parquet::new(out)?),
    };
    let written = export(&client, args, &query, sink.as_mut())
        .and_then(|open| if open { sink.finish() } else { Ok(()) });
    match (written, &target) {
        (Ok(()), Some((path, partial))) => std::fs::rename(partial, path).with_context(|| {
            format!("cannot rename {} to {}", partial.display(), path.display())
        })?,
        (Ok(()), None) => {}
        (Err(e), target) => {
            if let Some((_, partial)) = target {
                let _ = std::fs::remove_file(partial);
            }
            return Err(e);
        }
    }
    Ok(0)
}

/// Every run's history into `sink`; false when the reader went away
/// (stdout closed: `| head`).
fn export(
    client: &relaunch_client::Client,
    args: &ExportArgs,
    query: &HistoryQuery,
    sink: &mut dyn Sink,
) -> anyhow::Result<bool> {
    for run in &args.runs {
        let body = tracking::block_on(async {
            match client.history(run, query).await {
                Ok(body) => Ok(body),
                Err(e) if e.kind() == ErrorKind::NotFound => match client.get_run(run).await {
                    Ok(_) => Err(anyhow!("run {run:?}: {e}")),
                    Err(_) => Err(tracking::run_not_found(client, run)),
                },
                Err(e) => Err(tracking::explain(e, client, Some(run))),
            }
        })??;
        let series = columns::decode(&body)
            .with_context(|| format!("the history of run {run:?} came back damaged"))?;
        if !sink.series(run, &series)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Where the points go.
trait Sink {
    /// Takes one run's series; false when the reader went away.
    fn series(&mut self, run: &str, series: &[Columns]) -> anyhow::Result<bool>;
    /// Writes what is left, and the end.
    fn finish(&mut self) -> anyhow::Result<()>;
}

/// CSV, written as it is converted, a header first.
struct Csv<W: Write> {
    out: W,
    started: bool,
}

impl<W: Write> Csv<W> {
    fn new(out: W) -> Self {
        Self {
            out,
            started: false,
        }
    }

    fn write(&mut self, text: &[u8]) -> anyhow::Result<bool> {
        match self.out.write_all(text) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
            Err(e) => Err(anyhow::Error::from(e).context("cannot write the export")),
        }
    }
}

impl<W: Write> Sink for Csv<W> {
    fn series(&mut self, run: &str, series: &[Columns]) -> anyhow::Result<bool> {
        if !self.started {
            self.started = true;
            if !self.write(b"run,rank,step,key,value,wall,attempt\n")? {
                return Ok(false);
            }
        }
        let mut rows = Vec::with_capacity(1 << 20);
        for s in series {
            for i in 0..s.step.len() {
                row(&mut rows, run, s, i);
                if rows.len() >= 1 << 20 {
                    if !self.write(&rows)? {
                        return Ok(false);
                    }
                    rows.clear();
                }
            }
        }
        self.write(&rows)
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        if !self.started {
            self.started = true;
            if !self.write(b"run,rank,step,key,value,wall,attempt\n")? {
                return Ok(());
            }
        }
        match self.out.flush() {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            Err(e) => Err(anyhow::Error::from(e).context("cannot write the export")),
        }
    }
}

/// Rows in a Parquet row group at most.
const ROW_GROUP: usize = 1 << 20;

const PARQUET_SCHEMA: &str = "
message relaunch_export {
    REQUIRED BYTE_ARRAY run (STRING);
    REQUIRED INT32 rank (INTEGER(32, false));
    REQUIRED INT64 step;
    REQUIRED BYTE_ARRAY key (STRING);
    REQUIRED DOUBLE value;
    REQUIRED DOUBLE wall;
    REQUIRED INT32 attempt (INTEGER(32, false));
}";

/// Parquet: the points buffered by column, a row group at a time.
struct Parquet<W: Write + Send> {
    writer: Option<SerializedFileWriter<W>>,
    run: Vec<ByteArray>,
    rank: Vec<i32>,
    step: Vec<i64>,
    key: Vec<ByteArray>,
    value: Vec<f64>,
    wall: Vec<f64>,
    attempt: Vec<i32>,
}

impl<W: Write + Send> Parquet<W> {
    fn new(out: W) -> anyhow::Result<Self> {
        let schema = Arc::new(parse_message_type(PARQUET_SCHEMA).context("the Parquet schema")?);
        let properties = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_created_by(concat!("relaunch ", env!("CARGO_PKG_VERSION")).to_owned())
            .build();
        let writer = SerializedFileWriter::new(out, schema, Arc::new(properties))
            .context("cannot start the Parquet file")?;
        Ok(Self {
            writer: Some(writer),
            run: Vec::new(),
            rank: Vec::new(),
            step: Vec::new(),
            key: Vec::new(),
            value: Vec::new(),
            wall: Vec::new(),
            attempt: Vec::new(),
        })
    }

    fn row_group(&mut self) -> anyhow::Result<()> {
        if self.step.is_empty() {
            return Ok(());
        }
        let Some(writer) = self.writer.as_mut() else {
            bail!("the Parquet file is already closed");
        };
        let written = (|| -> parquet::errors::Result<()> {
            let mut group = writer.next_row_group()?;
            let mut index = 0;
            while let Some(mut column) = group.next_column()? {
                match index {
                    0 => column
                        .typed::<ByteArrayType>()
                        .write_batch(&self.run, None, None)?,
                    1 => column
                        .typed::<Int32Type>()
                        .write_batch(&self.rank, None, None)?,
                    2 => column
                        .typed::<Int64Type>()
                        .write_batch(&self.step, None, None)?,
                    3 => column
                        .typed::<ByteArrayType>()
                        .write_batch(&self.key, None, None)?,
                    4 => column
                        .typed::<DoubleType>()
                        .write_batch(&self.value, None, None)?,
                    5 => column
                        .typed::<DoubleType>()
                        .write_batch(&self.wall, None, None)?,
                    _ => column
                        .typed::<Int32Type>()
                        .write_batch(&self.attempt, None, None)?,
                };
                column.close()?;
                index += 1;
            }
            group.close()?;
            Ok(())
        })();
        written.context("cannot write the Parquet file")?;
        self.run.clear();
        self.rank.clear();
        self.step.clear();
        self.key.clear();
        self.value.clear();
        self.wall.clear();
        self.attempt.clear();
        Ok(())
    }
}

impl<W: Write + Send> Sink for Parquet<W> {
    fn series(&mut self, run: &str, series: &[Columns]) -> anyhow::Result<bool> {
        let name = ByteArray::from(run);
        for s in series {
            let key = ByteArray::from(s.key.as_str());
            for i in 0..s.step.len() {
                self.run.push(name.clone());
                // INT32 annotated unsigned: the bits of the u32.
                self.rank.push(s.rank as i32);
                self.step.push(s.step[i]);
                self.key.push(key.clone());
                self.value.push(s.value[i]);
                self.wall.push(s.wall[i]);
                self.attempt.push(s.attempt[i] as i32);
                if self.step.len() >= ROW_GROUP {
                    self.row_group()?;
                }
            }
        }
        Ok(true)
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        self.row_group()?;
        if let Some(writer) = self.writer.take() {
            let mut out = writer
                .into_inner()
                .context("cannot finish the Parquet file")?;
            out.flush().context("cannot write the Parquet file")?;
        }
        Ok(())
    }
}

/// One CSV row: names quoted when they hold a comma, a quote or a line
/// break; values as `relaunch metrics` writes them (`nan`, `inf`, `-inf`).
fn row(out: &mut Vec<u8>, run: &str, s: &Columns, i: usize) {
    let value = s.value[i];
    let value = if value.is_nan() {
        "nan".to_owned()
    } else {
        number(value)
    };
    let line = format!(
        "{},{},{},{},{value},{},{}\n",
        field(run),
        s.rank,
        s.step[i],
        field(&s.key),
        s.wall[i],
        s.attempt[i]
    );
    out.extend_from_slice(line.as_bytes());
}

fn field(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\"")).into()
    } else {
        text.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_exact_and_names_quoted_when_they_must_be() {
        let s = Columns {
            key: "loss,\"a\"".into(),
            rank: 1,
            step: vec![-3, i64::MAX],
            value: vec![f64::NAN, 0.1 + 0.2],
            wall: vec![1.5, 2.0],
            attempt: vec![0, 2],
        };
        let mut out = Vec::new();
        row(&mut out, "r1", &s, 0);
        row(&mut out, "r1", &s, 1);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "r1,1,-3,\"loss,\"\"a\"\"\",nan,1.5,0\n\
             r1,1,9223372036854775807,\"loss,\"\"a\"\"\",0.30000000000000004,2,2\n"
        );
    }
}
