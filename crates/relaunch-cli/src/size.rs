//! Byte sizes on the command line: `8388608`, `8MiB`, `64KiB`, `1GiB`.

/// Parses a size in bytes with an optional binary suffix (KiB, MiB, GiB;
/// K, M, G and KB, MB, GB mean the same).
pub(crate) fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: usize = digits.parse().map_err(|_| {
        format!("{text:?} is not a size; write bytes or a number with KiB, MiB or GiB")
    })?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {text:?}; use KiB, MiB or GiB"
            ));
        }
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("size {text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8388608"), Ok(8 << 20));
        assert_eq!(parse_size("8MiB"), Ok(8 << 20));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size(" 1 GiB "), Ok(1 << 30));
        assert!(parse_size("lots").is_err());
        assert!(
            parse_size("5 parsecs")
                .unwrap_err()
                .contains("unknown size unit")
        );
    }
}
