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
}
