//! Run filters in PostgreSQL's SQL: the runs a listing, its count, its
//! metric names and its latest values select, in the listing's order and
//! page, with their arguments.

use relaunch_api::RunFilter;

use crate::storage::StorageError;
use crate::storage::filter::{self, MetricFilter, Op, ParamValue, SortKey};

/// The runs that `filter` selects, in its order and page, as SQL selecting
/// `columns` of `runs r JOIN projects p`, and its arguments.
pub(super) fn filtered_runs(
    filter: &RunFilter,
    columns: &str,
) -> Result<(String, Vec<Arg>), StorageError> {
    let (mut sql, mut args) = selected(filter, columns)?;
    let sort = filter::sort(filter)?;
    let direction = if sort.descending { "DESC" } else { "ASC" };
    let column = |by: &str| format!("({by}) IS NULL, {by} {direction}");
    let order = match &sort.key {
        SortKey::Created => column("r.created_at"),
        SortKey::Updated => column("r.updated_at"),
        // Text in byte order, as SQLite's BINARY collation (names are
        // BYTEA, which sorts so).
        SortKey::Name => column("r.name"),
        SortKey::Status => column("r.status COLLATE \"C\""),
        SortKey::Attempts => column("r.attempts"),
        SortKey::Project => column("p.name COLLATE \"C\""),
        SortKey::Config(path) => {
            args.push(Arg::Path(path.clone()));
            let v = format!("(r.config::jsonb #> ${}::TEXT[])", args.len());
            // As SQLite's: numbers (booleans as 0 and 1) before strings,
            // either way.
            format!(
                "{v} IS NULL OR jsonb_typeof({v}) = 'null', \
                 jsonb_typeof({v}) NOT IN ('number', 'boolean'), \
                 CASE jsonb_typeof({v}) WHEN 'number' THEN ({v} #>> '{{}}')::NUMERIC \
                 WHEN 'boolean' THEN (CASE WHEN ({v} #>> '{{}}') = 'true' THEN 1 ELSE 0 END) \
                 END {direction}, ({v} #>> '{{}}') COLLATE \"C\" {direction}"
            )
        }
        SortKey::Summary(key) => {
            args.push(Arg::Text(key.clone()));
            column(&summary(args.len()))
        }
    };
    sql.push_str(&format!(
        " ORDER BY {order}, r.created_at DESC, r.id COLLATE \"C\" LIMIT {} OFFSET {}",
        filter::limit(filter),
        filter::offset(filter)
    ));
    Ok((sql, args))
}

/// How many runs `filter` selects, whatever its page (its order checked
/// all the same).
pub(super) fn counted_runs(filter: &RunFilter) -> Result<(String, Vec<Arg>), StorageError> {
    filter::sort(filter)?;
    selected(filter, "COUNT(*)")
}

/// `SELECT columns FROM runs r JOIN projects p WHERE` every condition of
/// `filter`, unordered, and its arguments.
fn selected(filter: &RunFilter, columns: &str) -> Result<(String, Vec<Arg>), StorageError> {
    let params = filter::params(filter)?;
    let metrics = filter::metrics(filter)?;
    let mut sql =
        format!("SELECT {columns} FROM runs r JOIN projects p ON p.id = r.project_id WHERE true");
    let mut args: Vec<Arg> = Vec::new();
    if let Some(project) = &filter.project {
        args.push(Arg::Text(project.clone()));
        sql.push_str(&format!(" AND p.name = ${}", args.len()));
    }
    if let Some(status) = filter.status {
        args.push(Arg::Text(status.as_str().to_owned()));
        sql.push_str(&format!(" AND r.status = ${}", args.len()));
    }
    if let Some(tag) = &filter.tag {
        args.push(Arg::Text(tag.clone()));
        sql.push_str(&format!(
            " AND EXISTS (SELECT 1 FROM json_array_elements_text(r.tags::json) t WHERE t = ${})",
            args.len()
        ));
    }
    if let Some(text) = filter.q.as_deref().filter(|t| !t.is_empty()) {
        // Names and notes are BYTEA (they may hold NUL): searched in
        // `escape` form, the text sought escaped the same way; ASCII
        // letters in any case, as SQLite's lower().
        args.push(Arg::Text(text.to_ascii_lowercase()));
        sql.push_str(&format!(
            " AND strpos(lower(encode(convert_to(r.id || ' ' || p.name || ' ' || r.tags || ' ', \
             'UTF8') || r.name || ' '::BYTEA || r.notes, 'escape')), \
             encode(convert_to(${}::TEXT, 'UTF8'), 'escape')) > 0",
            args.len()
        ));
    }
    for param in params {
        args.push(Arg::Path(param.path));
        let path = args.len();
        // Compared as SQLite's json_extract compares: numbers as numbers
        // (true and false as 1 and 0 for equality), strings as text.
        let eq = match param.op {
            Op::Eq | Op::Ne => true,
            Op::Lt | Op::Le | Op::Gt | Op::Ge => false,
        };
        let test = match param.value {
            ParamValue::Integer(i) => {
                args.push(Arg::Text(i.to_string()));
                number_test(args.len(), param.op)
            }
            ParamValue::Real(r) => {
                args.push(Arg::Text(r.to_string()));
                number_test(args.len(), param.op)
            }
            ParamValue::Text(t) if eq => {
                args.push(Arg::Text(t));
                format!(
                    "json_typeof(v) = 'string' AND (v #>> '{{}}') = ${}::TEXT",
                    args.len()
                )
            }
            // `filter::params` refuses an order with text.
            ParamValue::Text(_) => "false".to_owned(),
        };
        let holds = format!(
            "COALESCE((SELECT {test} FROM (SELECT r.config::json #> ${path}::TEXT[] AS v) x), false)"
        );
        sql.push_str(&match param.op {
            Op::Ne => format!(" AND NOT {holds}"),
            _ => format!(" AND {holds}"),
        });
    }
    for MetricFilter { key, op, value } in metrics {
        args.push(Arg::Text(key));
        let latest = summary(args.len());
        args.push(Arg::Float(value));
        let v = args.len();
        sql.push_str(&match op {
            Op::Ne => format!(" AND NOT COALESCE({latest} = ${v}, false)"),
            op => format!(" AND {latest} {} ${v}", op.sql()),
        });
    }
    Ok((sql, args))
}

/// The newest value (NULL for NaN, as SQLite stores it) of the metric
/// named by argument `arg` in run `r`, of the lowest rank that logged it.
fn summary(arg: usize) -> String {
    format!(
        "(SELECT NULLIF(l.value, 'NaN'::DOUBLE PRECISION) FROM keys k \
         JOIN latest l ON l.key_id = k.id \
         WHERE k.run_id = r.id AND k.name = ${arg}::TEXT ORDER BY l.rank LIMIT 1)"
    )
}

/// A comparison of the JSON value `v` with the number in argument `arg`:
/// numbers by value; for equality, true and false as 1 and 0.
pub(super) fn number_test(arg: usize, op: Op) -> String {
    let sign = op.sql();
    let boolean = match op {
        Op::Eq | Op::Ne => format!(
            "(CASE WHEN (v #>> '{{}}') = 'true' THEN 1 ELSE 0 END) = (${arg}::TEXT)::NUMERIC"
        ),
        _ => "false".to_owned(),
    };
    format!(
        "CASE json_typeof(v) \
         WHEN 'number' THEN (v #>> '{{}}')::NUMERIC {sign} (${arg}::TEXT)::NUMERIC \
         WHEN 'boolean' THEN {boolean} \
         ELSE false END"
    )
}

/// A query argument of a built query.
#[derive(Debug)]
pub(super) enum Arg {
    Text(String),
    Path(Vec<String>),
    Float(f64),
}

pub(super) fn sql_args(args: &[Arg]) -> Vec<&(dyn postgres::types::ToSql + Sync)> {
    args.iter()
        .map(|a| match a {
            Arg::Text(t) => t as &(dyn postgres::types::ToSql + Sync),
            Arg::Path(p) => p as &(dyn postgres::types::ToSql + Sync),
            Arg::Float(f) => f as &(dyn postgres::types::ToSql + Sync),
        })
        .collect()
}
