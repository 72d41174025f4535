//! A run listing's filter as every backend reads it: `param=PATH=VALUE`,
//! `metric=KEY<NUMBER`, the order and the page parsed and checked once. A
//! backend turns a [`ParamFilter`] into its own JSON lookup, a
//! [`MetricFilter`] and a [`Sort`] into its own SQL.

use relaunch_api::RunFilter;
use serde_json::Value;

use super::StorageError;

/// Rows a listing returns when the filter names no limit, and the most it may.
const DEFAULT_LIMIT: u32 = 10_000;
const MAX_LIMIT: u32 = 100_000;

/// A comparison of a filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Op {
    /// The comparison in SQL (`Ne` is written as NOT of `Eq` by the
    /// backends, so that a run without the value passes it).
    pub fn sql(self) -> &'static str {
        match self {
            Op::Eq | Op::Ne => "=",
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
        }
    }

    /// The operator as written in a filter.
    pub fn sign(self) -> &'static str {
        match self {
            Op::Ne => "!=",
            other => other.sql(),
        }
    }

    /// The operator at the start of `text` and its length: `>=` before `>`.
    fn parse(text: &str) -> Option<(Op, usize)> {
        [
            (">=", Op::Ge),
            ("<=", Op::Le),
            ("!=", Op::Ne),
            ("==", Op::Eq),
            ("=", Op::Eq),
            (">", Op::Gt),
            ("<", Op::Lt),
        ]
        .into_iter()
        .find(|(sign, _)| text.starts_with(sign))
        .map(|(sign, op)| (op, sign.len()))
    }
}

/// `config.PATH OP VALUE`.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamFilter {
    /// The dotted path's parts, each of letters, digits, `_` or `-`.
    pub path: Vec<String>,
    pub op: Op,
    pub value: ParamValue,
}

/// `summary.KEY OP VALUE`: the run's newest value of metric KEY (its
/// lowest rank). NaN passes only `!=`, as does a run without the metric.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricFilter {
    pub key: String,
    pub op: Op,
    pub value: f64,
}

/// What a listing is ordered by.
#[derive(Clone, Debug, PartialEq)]
pub enum SortKey {
    Created,
    Updated,
    Name,
    Status,
    Attempts,
    Project,
    /// A config value at a dotted path: numbers (by value) before strings.
    Config(Vec<String>),
    /// The newest value of a metric (its lowest rank).
    Summary(String),
}

/// A listing's order; runs without the value last either way, then the
/// newest first.
#[derive(Clone, Debug, PartialEq)]
pub struct Sort {
    pub key: SortKey,
    pub descending: bool,
}

/// The order of `filter`'s listing: newest first unless it names another.
pub fn sort(filter: &RunFilter) -> Result<Sort, StorageError> {
    let Some(text) = filter.sort.as_deref() else {
        return Ok(Sort {
            key: SortKey::Created,
            descending: true,
        });
    };
    let (descending, name) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let key = match name {
        "created" => SortKey::Created,
        "updated" => SortKey::Updated,
        "name" => SortKey::Name,
        "status" => SortKey::Status,
        "attempts" => SortKey::Attempts,
        "project" => SortKey::Project,
        _ => {
            if let Some(path) = name.strip_prefix("config.") {
                SortKey::Config(parse_path(path)?)
            } else if let Some(key) = name.strip_prefix("summary.").filter(|k| !k.is_empty()) {
                SortKey::Summary(key.to_owned())
            } else {
                return Err(StorageError::Invalid(format!(
                    "sort {text:?}: sort by created, updated, name, status, attempts, project, \
                     config.PATH or summary.KEY, with '-' first for descending"
                )));
            }
        }
    };
    Ok(Sort { key, descending })
}

/// The metric filters of `filter`, checked.
pub fn metrics(filter: &RunFilter) -> Result<Vec<MetricFilter>, StorageError> {
    filter.metric.iter().map(|m| parse_metric(m)).collect()
}

/// Runs skipped before the page.
pub fn offset(filter: &RunFilter) -> u32 {
    filter.offset.unwrap_or(0)
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

/// `text` split at its first operator: the name before it, the operator
/// and the value after it (both trimmed).
fn split_op(text: &str) -> Option<(&str, Op, &str)> {
    let at = text.find(['=', '<', '>', '!'])?;
    let (op, len) = Op::parse(&text[at..])?;
    Some((text[..at].trim(), op, text[at + len..].trim()))
}

fn parse_path(path: &str) -> Result<Vec<String>, StorageError> {
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
    Ok(path.split('.').map(str::to_owned).collect())
}

fn parse_metric(text: &str) -> Result<MetricFilter, StorageError> {
    let bad = |why: &str| {
        StorageError::Invalid(format!(
            "metric filter {text:?} {why}; write KEY OP NUMBER with OP one of = != < <= > >= \
             (e.g. loss<0.5)"
        ))
    };
    let (key, op, value) = split_op(text).ok_or_else(|| bad("has no comparison"))?;
    if key.is_empty() {
        return Err(bad("names no metric"));
    }
    let value: f64 = value
        .parse()
        .map_err(|_| bad(&format!("compares with {value:?}, not a number")))?;
    if value.is_nan() {
        return Err(bad("compares with NaN, which nothing equals"));
    }
    Ok(MetricFilter {
        key: key.to_owned(),
        op,
        value,
    })
}

fn parse_param(text: &str) -> Result<ParamFilter, StorageError> {
    let (path, op, value) = split_op(text).ok_or_else(|| {
        StorageError::Invalid(format!(
            "param filter {text:?} is not PATH=VALUE (e.g. optim.lr=0.001; also !=, <, <=, >, >=)"
        ))
    })?;
    let path = parse_path(path)?;
    let value = match serde_json::from_str::<Value>(value) {
        Ok(Value::Number(n)) => match n.as_i64() {
            Some(i) => ParamValue::Integer(i),
            None => ParamValue::Real(n.as_f64().unwrap_or(f64::NAN)),
        },
        Ok(Value::Bool(b)) => ParamValue::Integer(i64::from(b)),
        Ok(Value::String(s)) => ParamValue::Text(s),
        _ => ParamValue::Text(value.to_owned()),
    };
    if matches!(value, ParamValue::Text(_)) && !matches!(op, Op::Eq | Op::Ne) {
        return Err(StorageError::Invalid(format!(
            "param filter {text:?}: {} compares numbers, and {value:?} is not one",
            op.sign()
        )));
    }
    Ok(ParamFilter { path, op, value })
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
        let op = |t: &str| parse_param(t).unwrap().op;
        assert_eq!(op("a>=1"), Op::Ge);
        assert_eq!(op("a > 1"), Op::Gt);
        assert_eq!(op("a!=x"), Op::Ne);
        assert_eq!(op("a==1"), Op::Eq);
        assert!(
            parse_param("opt<adam")
                .unwrap_err()
                .to_string()
                .contains("compares numbers")
        );
    }

    #[test]
    fn metric_filters_and_sorts_parse_or_say_what_to_write() {
        let m = parse_metric("train/loss <= 0.5").unwrap();
        assert_eq!((m.key.as_str(), m.op, m.value), ("train/loss", Op::Le, 0.5));
        assert_eq!(parse_metric("acc>-inf").unwrap().value, f64::NEG_INFINITY);
        for bad in ["loss", "<1", "loss<abc", "loss=nan", "loss~1"] {
            let err = parse_metric(bad).unwrap_err().to_string();
            assert!(err.contains("KEY OP NUMBER"), "{bad}: {err}");
        }
        let sorted = |t: &str| {
            sort(&RunFilter {
                sort: Some(t.into()),
                ..RunFilter::default()
            })
        };
        assert_eq!(
            sorted("-summary.val/acc").unwrap(),
            Sort {
                key: SortKey::Summary("val/acc".into()),
                descending: true
            }
        );
        assert_eq!(
            sorted("config.optim.lr").unwrap().key,
            SortKey::Config(vec!["optim".into(), "lr".into()])
        );
        assert_eq!(
            sort(&RunFilter::default()).unwrap(),
            Sort {
                key: SortKey::Created,
                descending: true
            }
        );
        for bad in ["size", "summary.", "config.a..b", "-"] {
            assert!(sorted(bad).is_err(), "{bad}");
        }
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
