//! The rules for names that travel: run ids, project and writer names (which
//! become directory names and URL path segments) and metric keys. Server and
//! client apply the same rules, so a client never spools what the server
//! would refuse.

/// Longest run id, project or writer name.
pub const MAX_NAME: usize = 128;
/// Longest metric key, in bytes.
pub const MAX_KEY: usize = 256;

/// A run id, project or writer name: 1 to 128 of letters, digits, `-`, `_`,
/// `.`, not starting with a dot, so it is always a plain file name (no `/`,
/// no `..`, nothing absolute, nothing hidden) and a plain URL segment.
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} {name:?} is not allowed: use 1 to {MAX_NAME} letters, digits, '-', '_' or '.', not starting with '.'"
        ))
    }
}

/// A metric key: 1 to 256 bytes of printable text (it never names a file).
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_KEY || key.chars().any(char::is_control) {
        return Err(format!(
            "metric key {key:?} is not allowed: use 1 to {MAX_KEY} bytes of printable text"
        ));
    }
    Ok(())
}

/// Whether `key` is a system metric the launcher samples (`system/...`,
/// `gpu/...`), whose step is the wall-clock time in milliseconds since the
/// Unix epoch, not a training step: readers show it as a time, and goodput
/// leaves it out of the steps.
pub fn step_is_wall_millis(key: &str) -> bool {
    key.starts_with("system/") || key.starts_with("gpu/")
}

/// Longest event kind, in bytes.
pub const MAX_EVENT_KIND: usize = 64;

/// An event kind: 1 to 64 bytes of printable text.
pub fn check_event_kind(kind: &str) -> Result<(), String> {
    if kind.is_empty() || kind.len() > MAX_EVENT_KIND || kind.chars().any(char::is_control) {
        return Err(format!(
            "event kind {kind:?} is not allowed: use 1 to {MAX_EVENT_KIND} bytes of printable text"
        ));
    }
    Ok(())
}

/// Deepest nesting of arrays and objects in an event's data.
pub const MAX_EVENT_DEPTH: usize = 64;

/// An event's data: empty (none), or JSON nested at most
/// [`MAX_EVENT_DEPTH`] deep, so that what is stored reads back as itself.
pub fn check_event_data(data: &str) -> Result<(), String> {
    if data.is_empty() {
        return Ok(());
    }
    // Arrays and objects open at brackets outside strings: count them
    // before parsing, so nothing deeper than the limit is ever parsed.
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in data.bytes() {
        match (in_string, b) {
            (true, _) if escaped => escaped = false,
            (true, b'\\') => escaped = true,
            (true, b'"') => in_string = false,
            (true, _) => {}
            (false, b'"') => in_string = true,
            (false, b'[' | b'{') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (false, b']' | b'}') => depth = depth.saturating_sub(1),
            _ => {}
        }
        if deepest > MAX_EVENT_DEPTH {
            return Err(format!(
                "event data is nested more than {MAX_EVENT_DEPTH} arrays or objects deep; \
                 flatten it"
            ));
        }
    }
    serde_json::from_str::<serde_json::Value>(data)
        .map(|_| ())
        .map_err(|e| format!("event data is not valid JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_escape_a_directory_are_refused() {
        for bad in [
            "",
            "..",
            ".hidden",
            "a/b",
            "/abs",
            "a\\b",
            "%2e%2e",
            "x\0y",
            "é",
            &"x".repeat(129),
        ] {
            assert!(check_name("run id", bad).is_err(), "{bad:?}");
        }
        for good in ["run-1", "abc.def_2", "A"] {
            assert!(check_name("run id", good).is_ok(), "{good:?}");
        }
        assert!(check_key("train/loss").is_ok());
        assert!(check_key("bad\nkey").is_err());
        assert!(check_key(&"k".repeat(257)).is_err());
    }

    #[test]
    fn event_kinds_are_printable_and_data_is_shallow_json() {
        assert!(check_event_kind("worker_failed").is_ok());
        for bad in ["", "a\nb", "\u{1b}[31m", &"k".repeat(65)] {
            assert!(check_event_kind(bad).is_err(), "{bad:?}");
        }
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        for good in [
            "",
            "null",
            "{\"a\":[1,{\"b\":\"[[[\\\"\"}]}",
            &deep(MAX_EVENT_DEPTH),
        ] {
            assert_eq!(check_event_data(good), Ok(()), "{good}");
        }
        let err = check_event_data(&deep(MAX_EVENT_DEPTH + 1)).unwrap_err();
        assert!(err.contains("more than 64"), "{err}");
        assert!(check_event_data(&deep(100_000)).is_err());
        let err = check_event_data("{not json").unwrap_err();
        assert!(err.contains("not valid JSON"), "{err}");
    }
}
