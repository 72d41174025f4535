//! What `--webhook` and `--alert` say, parsed at start: a receiver or rule
//! that cannot work is refused then, with what was wrong and what to write.

use std::fmt;
use std::str::FromStr;

/// Where alerts are posted, and in which shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Webhook {
    pub url: String,
    pub format: Format,
}

/// The body of a webhook's posts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `{"text": ...}`: what Slack's incoming webhooks take (and Mattermost,
    /// Rocket.Chat, Teams' Slack-compatible hooks).
    Slack,
    /// The alert's fields as JSON (`kind`, `level`, `title`, `text`, `run`,
    /// `project`, `attempt`, `wall`, ...), for receivers of one's own.
    Json,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Slack => "slack",
            Self::Json => "json",
        }
    }
}

impl FromStr for Webhook {
    type Err = String;

    /// `URL`, `slack=URL` or `json=URL`; a bare URL on `hooks.slack.com`
    /// is Slack's shape, any other the JSON one.
    fn from_str(given: &str) -> Result<Self, String> {
        let (format, url) = match given.split_once('=') {
            Some(("slack", url)) => (Some(Format::Slack), url),
            Some(("json", url)) => (Some(Format::Json), url),
            _ => (None, given),
        };
        let parsed = reqwest::Url::parse(url).map_err(|e| {
            format!(
                "--webhook {given:?} is not a URL ({e}); give http(s)://HOST/PATH, optionally \
                 prefixed by slack= or json= for the shape of the posts"
            )
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!(
                "--webhook {given:?}: the scheme {:?} cannot be posted to; give an http:// or \
                 https:// URL",
                parsed.scheme()
            ));
        }
        let Some(host) = parsed.host_str() else {
            return Err(format!(
                "--webhook {given:?} has no host; give http(s)://HOST/PATH"
            ));
        };
        let format = format.unwrap_or(if host == "hooks.slack.com" {
            Format::Slack
        } else {
            Format::Json
        });
        Ok(Self {
            url: parsed.to_string(),
            format,
        })
    }
}

impl Webhook {
    /// The URL without its path and query, which often hold a secret
    /// (Slack's hook URLs are their own key): what logs and events show.
    pub fn shown(&self) -> String {
        match reqwest::Url::parse(&self.url) {
            Ok(url) => format!(
                "{}://{}{}",
                url.scheme(),
                url.host_str().unwrap_or(""),
                url.port().map(|p| format!(":{p}")).unwrap_or_default()
            ),
            Err(_) => "a webhook".into(),
        }
    }
}

/// A metric rule: `KEY is nan`, `KEY is inf`, `KEY is not finite`, or
/// `KEY OP NUMBER` with OP one of `> >= < <= == !=`.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub key: String,
    test: Test,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Test {
    Nan,
    Infinite,
    NotFinite,
    Compare(Op, f64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Greater,
    GreaterOrEqual,
    Less,
    LessOrEqual,
    Equal,
    NotEqual,
}

const OPS: [(&str, Op); 6] = [
    (">=", Op::GreaterOrEqual),
    ("<=", Op::LessOrEqual),
    ("==", Op::Equal),
    ("!=", Op::NotEqual),
    (">", Op::Greater),
    ("<", Op::Less),
];

impl Rule {
    /// Whether `value` of this rule's key fires it. A comparison is never
    /// true of NaN (say `is nan` for that).
    pub fn fires(&self, value: f64) -> bool {
        match self.test {
            Test::Nan => value.is_nan(),
            Test::Infinite => value.is_infinite(),
            Test::NotFinite => !value.is_finite(),
            Test::Compare(op, limit) => match op {
                Op::Greater => value > limit,
                Op::GreaterOrEqual => value >= limit,
                Op::Less => value < limit,
                Op::LessOrEqual => value <= limit,
                Op::Equal => value == limit,
                Op::NotEqual => !value.is_nan() && value != limit,
            },
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.test {
            Test::Nan => write!(f, "{} is nan", self.key),
            Test::Infinite => write!(f, "{} is inf", self.key),
            Test::NotFinite => write!(f, "{} is not finite", self.key),
            Test::Compare(op, limit) => {
                let op = OPS.iter().find(|(_, o)| *o == op).map_or("?", |(s, _)| *s);
                write!(f, "{} {op} {limit}", self.key)
            }
        }
    }
}

impl FromStr for Rule {
    type Err = String;

    fn from_str(given: &str) -> Result<Self, String> {
        let usage = "write KEY is nan, KEY is inf, KEY is not finite, or KEY OP NUMBER with OP \
                     one of > >= < <= == != (e.g. --alert \"loss > 10\")";
        let text = given.trim();
        let checked_key = |key: &str| -> Result<String, String> {
            let key = key.trim();
            if key.is_empty() {
                return Err(format!("--alert {given:?} names no metric; {usage}"));
            }
            // A key with an operator's character in it is a mistyped
            // operator ("loss => 1"), one with a space two words.
            if key.contains(['<', '>', '=', '!']) || key.contains(char::is_whitespace) {
                return Err(format!(
                    "--alert {given:?} is not a rule: {key:?} is not one metric key (no spaces \
                     or operators in it); {usage}"
                ));
            }
            relaunch_api::names::check_key(key)
                .map(|()| key.to_owned())
                .map_err(|e| format!("--alert {given:?}: {e}"))
        };
        for (suffix, test) in [
            (" is not finite", Test::NotFinite),
            (" is nan", Test::Nan),
            (" is inf", Test::Infinite),
        ] {
            // By characters: `get` is None where the cut would split one.
            let at = text.len().saturating_sub(suffix.len());
            if let (Some(key), Some(end)) = (text.get(..at), text.get(at..))
                && end.eq_ignore_ascii_case(suffix)
            {
                let key = checked_key(key)?;
                return Ok(Self { key, test });
            }
        }
        for (symbol, op) in OPS {
            if let Some((key, number)) = text.split_once(symbol) {
                let key = checked_key(key)?;
                let number = number.trim();
                let limit: f64 = number.parse().map_err(|_| {
                    format!("--alert {given:?}: {number:?} is not a number; {usage}")
                })?;
                if limit.is_nan() {
                    return Err(format!(
                        "--alert {given:?}: nothing compares to NaN; write \"{key} is nan\""
                    ));
                }
                let spelled_inf = number
                    .trim_start_matches(['+', '-'])
                    .to_ascii_lowercase()
                    .starts_with("inf");
                if limit.is_infinite() && !spelled_inf {
                    return Err(format!(
                        "--alert {given:?}: {number} is out of range (a float is at most \
                         {:e}); write \"{key} is inf\" to alert on infinity",
                        f64::MAX
                    ));
                }
                return Ok(Self {
                    key,
                    test: Test::Compare(op, limit),
                });
            }
        }
        Err(format!("--alert {given:?} is not a rule; {usage}"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn rules_read_as_written_and_fire_as_they_say() {
        let rule: Rule = "loss > 10".parse().unwrap();
        assert_eq!(rule.key, "loss");
        assert!(rule.fires(10.5) && !rule.fires(10.0) && !rule.fires(f64::NAN));
        assert_eq!(rule.to_string(), "loss > 10");
        let rule: Rule = "train/loss is NaN".parse().unwrap();
        assert_eq!(rule.key, "train/loss");
        assert!(rule.fires(f64::NAN) && !rule.fires(1.0) && !rule.fires(f64::INFINITY));
        let rule: Rule = "gnorm is not finite".parse().unwrap();
        assert!(rule.fires(f64::INFINITY) && rule.fires(f64::NAN) && !rule.fires(0.0));
        let rule: Rule = "acc>=0.99".parse().unwrap();
        assert!(rule.fires(0.99) && !rule.fires(0.5));
        let rule: Rule = "lr != 0.1".parse().unwrap();
        assert!(rule.fires(0.2) && !rule.fires(0.1) && !rule.fires(f64::NAN));
        let rule: Rule = "loss < -inf".parse().unwrap();
        assert!(!rule.fires(f64::NEG_INFINITY));
        let rule: Rule = "€ is nan".parse().unwrap();
        assert_eq!(rule.key, "€");
        let rule: Rule = "loss > 1e300".parse().unwrap();
        assert!(rule.fires(f64::INFINITY));
    }

    #[test]
    fn bad_rules_say_what_to_write() {
        for (bad, says) in [
            ("loss", "is not a rule"),
            ("loss >", "is not a number"),
            ("> 10", "names no metric"),
            ("loss > ten", "\"ten\" is not a number"),
            ("loss == nan", "write \"loss is nan\""),
            ("lo\u{1}ss > 1", "not allowed"),
            ("", "is not a rule"),
            // Issue 35: a multi-byte character where a suffix would start
            // panicked (exit 101 at start); these were taken silently.
            ("€€€€€", "is not a rule"),
            ("loss => 1", "\"loss =\" is not one metric key"),
            ("a b > 1", "\"a b\" is not one metric key"),
            ("loss > 1e999", "1e999 is out of range"),
        ] {
            let err = bad.parse::<Rule>().unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn webhooks_take_a_shape_and_refuse_what_cannot_be_posted_to() {
        let hook: Webhook = "https://hooks.slack.com/services/T/B/secret"
            .parse()
            .unwrap();
        assert_eq!(hook.format, Format::Slack);
        assert_eq!(hook.shown(), "https://hooks.slack.com");
        let hook: Webhook = "http://127.0.0.1:9000/in?key=s".parse().unwrap();
        assert_eq!(hook.format, Format::Json);
        assert_eq!(hook.shown(), "http://127.0.0.1:9000");
        let hook: Webhook = "slack=http://chat.local/hook".parse().unwrap();
        assert_eq!(hook.format, Format::Slack);
        let hook: Webhook = "json=https://hooks.slack.com/x".parse().unwrap();
        assert_eq!(hook.format, Format::Json);
        for (bad, says) in [
            ("hooks.slack.com/x", "is not a URL"),
            ("ftp://host/x", "cannot be posted to"),
            ("file:///etc/passwd", "cannot be posted to"),
            ("slack=not a url", "is not a URL"),
        ] {
            let err = bad.parse::<Webhook>().unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
