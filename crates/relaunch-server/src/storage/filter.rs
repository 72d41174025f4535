//! A run listing's filter as every backend reads it: `--param PATH=VALUE`
//! parsed and checked once, and the listing's row limit. A backend turns a
//! [`ParamFilter`] into its own JSON lookup.

use relaunch_api::RunFilter;
use serde_json::Value;

use super::StorageError;

/// Rows a listing returns when the filter names no limit, and the most it may.
const DEFAULT_LIMIT: u32 = 10_000;
const MAX_LIMIT: u32 = 100_000;

/// `config.PATH == VALUE`.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamFilter {
    /// The dotted path's parts, each of letters, digits, `_` or `-`.
    pub path: Vec<String>,
    pub value: ParamValue,
}

/// The value a param filter compares with, as the JSON it parses as (else
/// as text). `true`/`false` compare as 1/0, as SQLite's `json_extract` does.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamValue {
    Integer(i64),
    Real(f64),
    Text(String),
}

/// The param filters of `filter`, checked.
pub fn params(filter: &RunFilter) -> Result<Vec<ParamFilter>, StorageError> {
    filter.param.iter().map(|p| parse_param(p)).collect()
}

/// The most rows a listing with `filter` returns.
pub fn limit(filter: &RunFilter) -> u32 {
    filter.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT)
}

fn parse_param(text: &str) -> Result<ParamFilter, StorageError> {
    let (path, value) = text.split_once('=').ok_or_else(|| {
        StorageError::Invalid(format!(
            "param filter {text:?} is not PATH=VALUE (e.g. optim.lr=0.001)"
        ))
    })?;
    if path.is_empty()
        || !path.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == '-')
        })
    {
        return Err(StorageError::Invalid(format!(
            "param path {path:?} must be dotted names of letters, digits, '_' or '-'"
        )));
    }
    let value = match serde_json::from_str::<Value>(value) {
        Ok(Value::Number(n)) => match n.as_i64() {
            Some(i) => ParamValue::Integer(i),
            None => ParamValue::Real(n.as_f64().unwrap_or(f64::NAN)),
        },
        Ok(Value::Bool(b)) => ParamValue::Integer(i64::from(b)),
        Ok(Value::String(s)) => ParamValue::Text(s),
        _ => ParamValue::Text(value.to_owned()),
    };
    Ok(ParamFilter {
        path: path.split('.').map(str::to_owned).collect(),
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_as_json_else_text() {
        let parse = |t: &str| parse_param(t).unwrap().value;
        assert_eq!(parse("a=3"), ParamValue::Integer(3));
        assert_eq!(parse("a=0.5"), ParamValue::Real(0.5));
        assert_eq!(parse("a=true"), ParamValue::Integer(1));
        assert_eq!(parse("a=\"x\""), ParamValue::Text("x".into()));
        assert_eq!(parse("a=adam"), ParamValue::Text("adam".into()));
        assert_eq!(parse_param("optim.lr=1").unwrap().path, ["optim", "lr"]);
    }

    #[test]
    fn bad_paths_are_refused_naming_the_rule() {
        for bad in ["noequals", "=1", "a..b=1", "a/b=1", "a.'x=1"] {
            let err = parse_param(bad).unwrap_err().to_string();
            assert!(
                err.contains("PATH=VALUE") || err.contains("dotted names"),
                "{bad}: {err}"
            );
        }
    }
}
