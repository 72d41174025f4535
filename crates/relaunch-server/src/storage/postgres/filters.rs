//! Run filters in PostgreSQL's SQL: the `WHERE` a listing, its metric
//! names and its latest values share, with its arguments.

use relaunch_api::RunFilter;

use crate::storage::StorageError;
use crate::storage::filter::{self, ParamValue};

/// The runs that `filter` selects, newest first, as SQL selecting
/// `columns` of `runs r JOIN projects p`, and its arguments.
pub(super) fn filtered_runs(
    filter: &RunFilter,
    columns: &str,
) -> Result<(String, Vec<Arg>), StorageError> {
    let params_filter = filter::params(filter)?;
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
    for param in params_filter {
        args.push(Arg::Path(param.path));
        let path = args.len();
        // Compared as SQLite's json_extract compares: numbers as numbers
        // (true and false as 1 and 0), strings as text.
        let test = match param.value {
            ParamValue::Integer(i) => {
                args.push(Arg::Text(i.to_string()));
                number_test(args.len())
            }
            ParamValue::Real(r) => {
                args.push(Arg::Text(r.to_string()));
                number_test(args.len())
            }
            ParamValue::Text(t) => {
                args.push(Arg::Text(t));
                format!(
                    "json_typeof(v) = 'string' AND (v #>> '{{}}') = ${}::TEXT",
                    args.len()
                )
            }
        };
        sql.push_str(&format!(
            " AND COALESCE((SELECT {test} FROM (SELECT r.config::json #> ${path}::TEXT[] AS v) x), false)"
        ));
    }
    sql.push_str(&format!(
        " ORDER BY r.created_at DESC, r.id LIMIT {}",
        filter::limit(filter)
    ));
    Ok((sql, args))
}

pub(super) fn number_test(arg: usize) -> String {
    format!(
        "CASE json_typeof(v) \
         WHEN 'number' THEN (v #>> '{{}}')::NUMERIC = (${arg}::TEXT)::NUMERIC \
         WHEN 'boolean' THEN (CASE WHEN (v #>> '{{}}') = 'true' THEN 1 ELSE 0 END) = (${arg}::TEXT)::NUMERIC \
         ELSE false END"
    )
}

/// A query argument of a built query.
#[derive(Debug)]
pub(super) enum Arg {
    Text(String),
    Path(Vec<String>),
}

pub(super) fn sql_args(args: &[Arg]) -> Vec<&(dyn postgres::types::ToSql + Sync)> {
    args.iter()
        .map(|a| match a {
            Arg::Text(t) => t as &(dyn postgres::types::ToSql + Sync),
            Arg::Path(p) => p as &(dyn postgres::types::ToSql + Sync),
        })
        .collect()
}
