//! SLURM's hostlist syntax (`SLURM_JOB_NODELIST`): `gpu[01-04,07],cpu3`,
//! `n[1-2]-ib`, `rack[1-2]n[01-02]`.
//!
//! The grammar, as Slurm's `hostlist.c` reads it: a comma-separated list
//! (commas inside brackets belong to the brackets) of host expressions; an
//! expression is literal text with any number of bracket groups, each a
//! comma-separated list of numbers and `LO-HI` ranges. Several groups
//! expand as a product, the last group varying fastest (`a[1-2]b[1-2]`:
//! a1b1, a1b2, a2b1, a2b2). A range keeps the width of its low end, so
//! zero padding survives (`[08-10]`: 08, 09, 10). Anything else (nested or
//! unbalanced brackets, an empty group, `HI < LO`, letters in a group) is
//! refused with the offending text, never guessed at.

/// At most this many names in one list; Slurm's largest clusters are well
/// under it, and a typo such as `n[1-99999999]` should not fill memory.
pub(crate) const MAX_HOSTS: u64 = 1_000_000;

/// A parsed hostlist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostList {
    hosts: Vec<Host>,
}

/// One expression: literal text and bracket groups, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Host {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Group(Vec<Range>),
}

/// `LO-HI` (or a single number, `LO == HI`), printed `width` digits wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    lo: u64,
    hi: u64,
    width: usize,
}

impl HostList {
    /// Parses `text`; the error names what is wrong and where.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("hostlist {text:?}: {why}");
        if text.trim().is_empty() {
            return Err(bad("is empty"));
        }
        let mut hosts = Vec::new();
        for expr in split_top_level(text).map_err(|e| bad(&e))? {
            let expr = expr.trim();
            if expr.is_empty() {
                return Err(bad("has an empty name (two commas, or one at an end)"));
            }
            hosts.push(Host::parse(expr).map_err(|e| bad(&e))?);
        }
        let list = Self { hosts };
        if list.len() > MAX_HOSTS {
            return Err(bad(&format!(
                "names {} hosts, more than the {MAX_HOSTS} relaunch accepts",
                list.len()
            )));
        }
        Ok(list)
    }

    /// How many names the list expands to.
    pub(crate) fn len(&self) -> u64 {
        self.hosts
            .iter()
            .map(Host::len)
            .fold(0u64, u64::saturating_add)
    }

    /// The first name (Slurm's node 0), without expanding the rest.
    pub(crate) fn first(&self) -> String {
        // A parsed list has at least one expression, and every group at
        // least one range.
        self.hosts.first().map(Host::first).unwrap_or_default()
    }

    /// Every name, in Slurm's order (tests check `first` and `len` by it).
    #[cfg(test)]
    pub(crate) fn expand(&self) -> Vec<String> {
        self.hosts.iter().flat_map(Host::expand).collect()
    }
}

impl Host {
    fn parse(expr: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = expr;
        while !rest.is_empty() {
            match rest.find('[') {
                None => {
                    if rest.contains(']') {
                        return Err(format!("{expr:?} has a ']' without its '['"));
                    }
                    parts.push(Part::Text(rest.to_owned()));
                    rest = "";
                }
                Some(open) => {
                    let text = &rest[..open];
                    if text.contains(']') {
                        return Err(format!("{expr:?} has a ']' without its '['"));
                    }
                    if !text.is_empty() {
                        parts.push(Part::Text(text.to_owned()));
                    }
                    let after = &rest[open + 1..];
                    let close = after
                        .find(']')
                        .ok_or_else(|| format!("{expr:?} has a '[' without its ']'"))?;
                    let inside = &after[..close];
                    if inside.contains('[') {
                        return Err(format!("{expr:?} nests brackets"));
                    }
                    parts.push(Part::Group(parse_group(expr, inside)?));
                    rest = &after[close + 1..];
                }
            }
        }
        Ok(Self { parts })
    }

    fn len(&self) -> u64 {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Text(_) => 1,
                Part::Group(ranges) => ranges
                    .iter()
                    .map(|r| r.hi - r.lo + 1)
                    .fold(0u64, u64::saturating_add),
            })
            .fold(1u64, u64::saturating_mul)
    }

    fn first(&self) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.clone(),
                Part::Group(ranges) => ranges[0].format(ranges[0].lo),
            })
            .collect()
    }

    #[cfg(test)]
    fn expand(&self) -> Vec<String> {
        let mut names = vec![String::new()];
        for part in &self.parts {
            names = match part {
                Part::Text(t) => names.into_iter().map(|n| n + t).collect(),
                Part::Group(ranges) => names
                    .iter()
                    .flat_map(|n| {
                        ranges.iter().flat_map(move |r| {
                            (r.lo..=r.hi).map(move |i| format!("{n}{}", r.format(i)))
                        })
                    })
                    .collect(),
            };
        }
        names
    }
}

impl Range {
    fn format(self, i: u64) -> String {
        format!("{i:0width$}", width = self.width)
    }
}

/// Splits at the commas outside brackets.
fn split_top_level(text: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| "has a ']' without its '['".to_owned())?;
            }
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("has a '[' without its ']'".into());
    }
    out.push(&text[start..]);
    Ok(out)
}

fn parse_group(expr: &str, inside: &str) -> Result<Vec<Range>, String> {
    if inside.trim().is_empty() {
        return Err(format!("{expr:?} has an empty '[]'"));
    }
    inside
        .split(',')
        .map(|item| {
            let item = item.trim();
            let number = |s: &str| {
                if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(format!(
                        "{expr:?}: {item:?} in brackets is not a number or a LO-HI range"
                    ));
                }
                s.parse::<u64>()
                    .map_err(|_| format!("{expr:?}: {s:?} is too large"))
            };
            let (lo_text, hi_text) = item.split_once('-').unwrap_or((item, item));
            let (lo, hi) = (number(lo_text)?, number(hi_text)?);
            if hi < lo {
                return Err(format!("{expr:?}: the range {item:?} runs backwards"));
            }
            Ok(Range {
                lo,
                hi,
                width: lo_text.len(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(text: &str) -> Vec<String> {
        HostList::parse(text).unwrap().expand()
    }

    #[test]
    fn plain_names_and_lists() {
        assert_eq!(expand("node7"), ["node7"]);
        assert_eq!(expand("a,b , c"), ["a", "b", "c"]);
        assert_eq!(expand("gpu-01.cluster"), ["gpu-01.cluster"]);
    }

    #[test]
    fn ranges_keep_zero_padding() {
        assert_eq!(
            expand("gpu[01-04,07],cpu3"),
            ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"]
        );
        assert_eq!(expand("n[08-11]"), ["n08", "n09", "n10", "n11"]);
        assert_eq!(expand("n[8-11]"), ["n8", "n9", "n10", "n11"]);
        assert_eq!(expand("n[098-101]"), ["n098", "n099", "n100", "n101"]);
        assert_eq!(expand("n[5]"), ["n5"]);
    }

    #[test]
    fn text_after_a_group_and_several_groups() {
        assert_eq!(expand("n[1-2]-ib"), ["n1-ib", "n2-ib"]);
        assert_eq!(
            expand("a[001-002]b[1-2]"),
            ["a001b1", "a001b2", "a002b1", "a002b2"]
        );
        assert_eq!(
            expand("r[1-2]n[01,03]-ib,login"),
            ["r1n01-ib", "r1n03-ib", "r2n01-ib", "r2n03-ib", "login"]
        );
        assert_eq!(expand("[1-2]x"), ["1x", "2x"]);
    }

    #[test]
    fn first_len_and_expand_agree() {
        for text in [
            "gpu[01-04,07],cpu3",
            "a[001-010]b[1-2]",
            "x",
            "n[9-10]-ib,m[3]",
        ] {
            let list = HostList::parse(text).unwrap();
            let all = list.expand();
            assert_eq!(list.first(), all[0], "{text}");
            assert_eq!(list.len(), all.len() as u64, "{text}");
        }
        assert_eq!(HostList::parse("a[001-010]b[1-2]").unwrap().len(), 20);
    }

    #[test]
    fn malformed_lists_are_refused_with_the_reason() {
        for (text, needle) in [
            ("", "is empty"),
            ("  ", "is empty"),
            ("a,,b", "empty name"),
            ("a,", "empty name"),
            ("n[1-4", "without its ']'"),
            ("n1-4]", "without its '['"),
            ("n]1[", "without its '['"),
            ("n[]", "empty '[]'"),
            ("n[[1-2]]", "nests"),
            ("n[4-1]", "runs backwards"),
            ("n[a-c]", "not a number"),
            ("n[1-]", "not a number"),
            ("n[-3]", "not a number"),
            ("n[1,,2]", "not a number"),
            ("n[1-2-3]", "not a number"),
            ("n[99999999999999999999]", "too large"),
            ("n[0-999999]x[0-9]", "more than the"),
        ] {
            let err = HostList::parse(text).unwrap_err();
            assert!(err.contains(needle), "{text:?}: {err}");
            assert!(err.starts_with("hostlist "), "{text:?}: {err}");
        }
    }
}
