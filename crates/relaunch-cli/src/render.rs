//! Text for people: aligned tables, times and numbers. Pure functions; the
//! commands print what they return through `output`.

use std::time::{SystemTime, UNIX_EPOCH};

/// Columns padded to their widest cell, two spaces apart, no trailing
/// blanks. Widths are terminal cells (a CJK character or an emoji takes
/// two), so wide names line up. The last column may hold several lines;
/// the later ones are indented to where that column starts.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    use unicode_width::UnicodeWidthStr as _;
    let columns = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.width()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(columns.saturating_sub(1)) {
            widths[i] = widths[i].max(cell.width());
        }
    }
    let indent: usize = widths[..columns.saturating_sub(1)]
        .iter()
        .map(|w| w + 2)
        .sum();
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate().take(columns) {
            if i + 1 == columns {
                let mut parts = cell.lines();
                line.push_str(parts.next().unwrap_or_default());
                for part in parts {
                    line.push('\n');
                    line.push_str(&" ".repeat(indent));
                    line.push_str(part);
                }
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(widths[i] - cell.width() + 2));
            }
        }
        for part in line.lines() {
            out.push_str(part.trim_end());
            out.push('\n');
        }
    }
    out
}

/// Seconds since the Unix epoch, now.
pub(crate) fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// How long before `now` the time `then` was: `12s ago`, `3m ago`,
/// `5h ago`, `2d ago` (a clock ahead of ours shows `just now`).
pub(crate) fn age(then: f64, now: f64) -> String {
    let seconds = (now - then).max(0.0) as u64;
    match seconds {
        0 => "just now".to_owned(),
        s if s < 60 => format!("{s}s ago"),
        s if s < 3600 => format!("{}m ago", s / 60),
        s if s < 86_400 => format!("{}h ago", s / 3600),
        s => format!("{}d ago", s / 86_400),
    }
}

/// Seconds since the Unix epoch as UTC, `2024-05-01T12:34:56Z`.
pub(crate) fn utc(seconds: f64) -> String {
    let total = seconds.floor() as i64;
    let (days, secs) = (total.div_euclid(86_400), total.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A metric value short and exact: Rust's shortest round-trip form, in
/// exponent notation when plain digits would run long.
pub(crate) fn number(value: f64) -> String {
    let magnitude = value.abs();
    if value == 0.0 || !value.is_finite() || (1e-4..1e15).contains(&magnitude) {
        format!("{value}")
    } else {
        format!("{value:e}")
    }
}
/// `text` and blanks to `width` terminal cells (none when it is wider).
pub(crate) fn pad(text: &str, width: usize) -> String {
    use unicode_width::UnicodeWidthStr as _;
    format!("{text}{}", " ".repeat(width.saturating_sub(text.width())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_indent_continued_lines() {
        let rows = vec![
            vec!["a".to_owned(), "long value".to_owned(), "x".to_owned()],
            vec!["bbb".to_owned(), "v".to_owned(), "first\nsecond".to_owned()],
        ];
        assert_eq!(
            table(&["K", "VALUE", "TEXT"], &rows),
            "K    VALUE       TEXT\n\
             a    long value  x\n\
             bbb  v           first\n\
             \x20                second\n"
        );
        assert_eq!(table(&["ID", "NAME"], &[]), "ID  NAME\n");
    }

    /// Regression: cells were padded by characters, so a name of wide
    /// characters pushed its row's later columns right.
    #[test]
    fn wide_characters_take_two_cells() {
        let rows = vec![
            vec!["实验一".to_owned(), "a".to_owned()],
            vec!["run🚀".to_owned(), "b".to_owned()],
            vec!["plain".to_owned(), "c".to_owned()],
        ];
        assert_eq!(
            table(&["NAME", "X"], &rows),
            "NAME    X\n\
             实验一  a\n\
             run🚀   b\n\
             plain   c\n"
        );
    }

    #[test]
    fn ages_round_down_to_one_unit() {
        assert_eq!(age(100.0, 100.4), "just now");
        assert_eq!(age(100.0, 112.0), "12s ago");
        assert_eq!(age(0.0, 185.0), "3m ago");
        assert_eq!(age(0.0, 7200.0), "2h ago");
        assert_eq!(age(0.0, 3.0 * 86_400.0), "3d ago");
        assert_eq!(age(200.0, 100.0), "just now");
    }

    #[test]
    fn utc_times_match_known_dates() {
        assert_eq!(utc(0.0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400.5), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_718_454_896.0), "2024-06-15T12:34:56Z");
        assert_eq!(utc(-1.0), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn numbers_stay_short() {
        assert_eq!(number(0.1), "0.1");
        assert_eq!(number(0.0), "0");
        assert_eq!(number(1234.5), "1234.5");
        assert_eq!(number(1e-10), "1e-10");
        assert_eq!(number(-2.5e20), "-2.5e20");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "inf");
    }
}
