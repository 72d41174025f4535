//! Run filters in SQLite's SQL: the runs a listing, its count, its metric
//! names and its latest values select, in the listing's order and page.

use relaunch_api::RunFilter;
use rusqlite::types::Value;

use crate::storage::StorageError;
use crate::storage::filter::{self, MetricFilter, Op, ParamValue, SortKey};

/// The runs that `filter` selects, in its order and page, as SQL selecting
/// `columns` of `runs r JOIN projects p`, and its arguments; a list or a
/// subquery (`... IN (SQL)`).
pub(super) fn filtered_runs(
    filter: &RunFilter,
    columns: &str,
) -> Result<(String, Vec<Value>), StorageError> {
    let (mut sql, mut args) = selected(filter, columns)?;
    let sort = filter::sort(filter)?;
    let direction = if sort.descending { "DESC" } else { "ASC" };
    let column = |by: &str| format!("({by}) IS NULL, {by} {direction}");
    let order = match &sort.key {
        SortKey::Created => column("r.created_at"),
        SortKey::Updated => column("r.updated_at"),
        SortKey::Name => column("r.name"),
        SortKey::Status => column("r.status"),
        SortKey::Attempts => column("r.attempts"),
        SortKey::Project => column("p.name"),
        SortKey::Config(path) => {
            args.push(json_path(path).into());
            let p = args.len();
            // Numbers (booleans as 0 and 1) before strings, either way.
            format!(
                "json_type(r.config, ?{p}) IS NULL OR json_type(r.config, ?{p}) = 'null', \
                 json_type(r.config, ?{p}) NOT IN ('integer', 'real', 'true', 'false'), \
                 json_extract(r.config, ?{p}) {direction}"
            )
        }
        SortKey::Summary(key) => {
            args.push(key.clone().into());
            column(&summary(args.len()))
        }
    };
    sql.push_str(&format!(
        " ORDER BY {order}, r.created_at DESC, r.id LIMIT {} OFFSET {}",
        filter::limit(filter),
        filter::offset(filter)
    ));
    Ok((sql, args))
}

/// How many runs `filter` selects, whatever its page (its order checked
/// all the same).
pub(super) fn counted_runs(filter: &RunFilter) -> Result<(String, Vec<Value>), StorageError> {
    filter::sort(filter)?;
    selected(filter, "COUNT(*)")
}

/// `SELECT columns FROM runs r JOIN projects p WHERE` every condition of
/// `filter`, unordered, and its arguments.
fn selected(filter: &RunFilter, columns: &str) -> Result<(String, Vec<Value>), StorageError> {
    let params = filter::params(filter)?;
    let metrics = filter::metrics(filter)?;
    let mut sql =
        format!("SELECT {columns} FROM runs r JOIN projects p ON p.id = r.project_id WHERE 1=1");
    let mut args: Vec<Value> = Vec::new();
    if let Some(project) = &filter.project {
        args.push(project.clone().into());
        sql.push_str(&format!(" AND p.name = ?{}", args.len()));
    }
    if let Some(status) = filter.status {
        args.push(status.as_str().to_owned().into());
        sql.push_str(&format!(" AND r.status = ?{}", args.len()));
    }
    if let Some(tag) = &filter.tag {
        args.push(tag.clone().into());
        sql.push_str(&format!(
            " AND EXISTS (SELECT 1 FROM json_each(r.tags) WHERE json_each.value = ?{})",
            args.len()
        ));
    }
    if let Some(text) = filter.q.as_deref().filter(|t| !t.is_empty()) {
        // ASCII letters in any case (SQLite's lower() changes only those).
        args.push(text.to_ascii_lowercase().into());
        sql.push_str(&format!(
            " AND instr(lower(r.id || ' ' || r.name || ' ' || p.name || ' ' || r.tags || ' ' \
             || r.notes), ?{}) > 0",
            args.len()
        ));
    }
    for param in params {
        args.push(json_path(&param.path).into());
        let p = args.len();
        args.push(match param.value {
            ParamValue::Integer(i) => Value::Integer(i),
            ParamValue::Real(r) => Value::Real(r),
            ParamValue::Text(t) => Value::Text(t),
        });
        let v = args.len();
        let value = format!("json_extract(r.config, ?{p})");
        sql.push_str(&match param.op {
            Op::Eq => format!(" AND {value} = ?{v}"),
            Op::Ne => format!(" AND NOT COALESCE({value} = ?{v}, 0)"),
            // Orders compare numbers only (SQLite puts text above them).
            op => format!(
                " AND json_type(r.config, ?{p}) IN ('integer', 'real') AND {value} {} ?{v}",
                op.sql()
            ),
        });
    }
    for MetricFilter { key, op, value } in metrics {
        args.push(key.into());
        let latest = summary(args.len());
        args.push(Value::Real(value));
        let v = args.len();
        sql.push_str(&match op {
            Op::Ne => format!(" AND NOT COALESCE({latest} = ?{v}, 0)"),
            op => format!(" AND {latest} {} ?{v}", op.sql()),
        });
    }
    Ok((sql, args))
}

/// The newest value (NULL for NaN) of the metric named by argument `arg`
/// in run `r`, of the lowest rank that logged it.
fn summary(arg: usize) -> String {
    format!(
        "(SELECT l.value FROM keys k JOIN latest l ON l.key_id = k.id \
         WHERE k.run_id = r.id AND k.name = ?{arg} ORDER BY l.rank LIMIT 1)"
    )
}

/// A dotted config path as a JSON path (`$."optim"."lr"`).
fn json_path(parts: &[String]) -> String {
    format!(
        "$.{}",
        parts
            .iter()
            .map(|p| format!("\"{p}\""))
            .collect::<Vec<_>>()
            .join(".")
    )
}
