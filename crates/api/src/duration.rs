//! Durations as they appear in manifests: Go/Kubernetes style strings such as `30s`, `1m30s`,
//! `250ms` or `2h`.
//!
//! The CRD schema carries [`DURATION_PATTERN`], so the API server rejects a malformed or negative
//! duration before it is stored. The type still keeps the text it was given and parses it on
//! demand: an object that slipped past admission (an older CRD, a hand-edited etcd) must never
//! stop the operator from reading the *other* objects of a list.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::time::Duration as StdDuration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// The pattern the CRD schema enforces: one or more `<number><unit>` groups, units `ms`, `s`,
/// `m`, `h`; no sign, so negative durations are rejected at admission.
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$";

/// The largest duration accepted (a year). Anything longer is a typo, and refusing it keeps
/// arithmetic on instants far away from overflow.
pub const MAX_DURATION: StdDuration = StdDuration::from_secs(366 * 24 * 3600);

/// The longest duration a spec field may carry (a WorkerBackpressure's or a policy's defaults):
/// 24 hours. Every duration of the API is a control-loop time constant (a hold, a dwell, a
/// window, a timeout); a day is already far beyond any sensible one, and a longer value is a
/// typo or an attempt to freeze the loop (`dwell: 100000h` would keep a ramp stage forever).
/// The CRD schema enforces it at admission (a CEL rule on every duration field, whose message
/// the API server prefixes with the field's path); the operator refuses a longer value that
/// slipped past it (an object stored under an older CRD) as an invalid spec naming the field.
pub const MAX_SPEC_DURATION: StdDuration = StdDuration::from_secs(24 * 3600);

/// The CEL rule of every duration field: at most [`MAX_SPEC_DURATION`]. Pattern-checked first
/// by the schema, so `duration()` sees a Go duration.
pub const MAX_SPEC_DURATION_RULE: &str = "duration(self) <= duration('24h')";

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// The string is empty.
    #[error("empty duration; expected a number with a unit such as 30s, 5m or 250ms")]
    Empty,
    /// A character that is not part of a `<number><unit>` group.
    #[error(
        "invalid duration {0:?}: expected groups of a number and a unit (ms, s, m, h), such as 1m30s"
    )]
    Syntax(String),
    /// A number without a unit, or a unit that is not one of `ms`, `s`, `m`, `h`.
    #[error("invalid duration {0:?}: every number needs a unit (ms, s, m, h)")]
    Unit(String),
    /// Longer than [`MAX_DURATION`].
    #[error("duration {0:?} is longer than the maximum of 366 days")]
    TooLong(String),
}

/// Parses a Go-style duration (`1h2m3.5s`, `250ms`). Negative values and values without units
/// are refused: every duration in this API is a length of time, never an offset.
pub fn parse_duration(text: &str) -> Result<StdDuration, DurationError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut total_nanos: u128 = 0;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        let int_end = i;
        let mut frac_end = i;
        if i < bytes.len() && bytes[i] == b'.' {
            i += 1;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            frac_end = i;
        }
        if int_end == start {
            return Err(DurationError::Syntax(text.to_owned()));
        }
        let unit_start = i;
        while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
            i += 1;
        }
        let unit = &s[unit_start..i];
        let nanos_per_unit: u128 = match unit {
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3600 * 1_000_000_000,
            "" => return Err(DurationError::Unit(text.to_owned())),
            _ => return Err(DurationError::Unit(text.to_owned())),
        };
        // Integer part; more than 12 digits is far beyond MAX_DURATION in any unit.
        let int_digits = &s[start..int_end];
        if int_digits.len() > 12 {
            return Err(DurationError::TooLong(text.to_owned()));
        }
        let int: u128 = int_digits
            .parse()
            .map_err(|_| DurationError::Syntax(text.to_owned()))?;
        total_nanos = total_nanos.saturating_add(int.saturating_mul(nanos_per_unit));
        if frac_end > int_end + 1 {
            // Keep at most 9 fractional digits: nanosecond resolution.
            let frac = &s[int_end + 1..frac_end];
            let frac = &frac[..frac.len().min(9)];
            let scale = 10u128.pow(frac.len() as u32);
            let f: u128 = frac
                .parse()
                .map_err(|_| DurationError::Syntax(text.to_owned()))?;
            total_nanos = total_nanos.saturating_add(f.saturating_mul(nanos_per_unit) / scale);
        } else if frac_end == int_end + 1 {
            return Err(DurationError::Syntax(text.to_owned()));
        }
        if i < bytes.len() && !bytes[i].is_ascii_digit() {
            return Err(DurationError::Syntax(text.to_owned()));
        }
    }
    if total_nanos > MAX_DURATION.as_nanos() {
        return Err(DurationError::TooLong(text.to_owned()));
    }
    let secs = (total_nanos / 1_000_000_000) as u64;
    let nanos = (total_nanos % 1_000_000_000) as u32;
    Ok(StdDuration::new(secs, nanos))
}

/// Formats a duration the way Go does for whole units (`1h30m`, `45s`, `250ms`).
pub fn format_duration(d: StdDuration) -> String {
    let total_ms = d.as_millis();
    if total_ms == 0 {
        return "0s".to_owned();
    }
    if !total_ms.is_multiple_of(1000) {
        return format!("{total_ms}ms");
    }
    let mut secs = d.as_secs();
    let mut out = String::new();
    let h = secs / 3600;
    secs %= 3600;
    let m = secs / 60;
    secs %= 60;
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if secs > 0 {
        out.push_str(&format!("{secs}s"));
    }
    out
}

/// A duration field in a manifest. It keeps the original text (so that round trips and
/// server-side apply see exactly what the user wrote) and parses on demand.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Duration(String);

impl Duration {
    /// A duration from a standard duration, formatted like Go.
    pub fn from_std(d: StdDuration) -> Self {
        Self(format_duration(d))
    }

    /// The text as written in the manifest.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The parsed value, or why the text is not a duration.
    pub fn get(&self) -> Result<StdDuration, DurationError> {
        parse_duration(&self.0)
    }
}

impl FromStr for Duration {
    type Err = DurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_duration(s)?;
        Ok(Self(s.trim().to_owned()))
    }
}

impl From<StdDuration> for Duration {
    fn from(d: StdDuration) -> Self {
        Self::from_std(d)
    }
}

impl fmt::Debug for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_generator: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
            "maxLength": 32,
            "x-kubernetes-validations": [{
                "rule": MAX_SPEC_DURATION_RULE,
                "message": "must be at most 24h",
            }],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        let cases = [
            ("30s", StdDuration::from_secs(30)),
            ("1m30s", StdDuration::from_secs(90)),
            ("250ms", StdDuration::from_millis(250)),
            ("2h", StdDuration::from_secs(7200)),
            ("1.5s", StdDuration::from_millis(1500)),
            ("0s", StdDuration::ZERO),
            ("1h1m1s", StdDuration::from_secs(3661)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_bad_durations_with_reasons() {
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        assert!(matches!(
            parse_duration("-5s"),
            Err(DurationError::Syntax(_))
        ));
        assert!(matches!(parse_duration("5"), Err(DurationError::Unit(_))));
        assert!(matches!(parse_duration("5d"), Err(DurationError::Unit(_))));
        assert!(matches!(parse_duration("s"), Err(DurationError::Syntax(_))));
        assert!(matches!(
            parse_duration("5.s"),
            Err(DurationError::Syntax(_))
        ));
        assert!(matches!(
            parse_duration("9999h"),
            Err(DurationError::TooLong(_))
        ));
        assert!(matches!(
            parse_duration("99999999999999999999s"),
            Err(DurationError::TooLong(_))
        ));
        let msg = parse_duration("5d").unwrap_err().to_string();
        assert!(msg.contains("unit"), "{msg}");
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format_duration(StdDuration::from_secs(90)), "1m30s");
        assert_eq!(format_duration(StdDuration::from_millis(250)), "250ms");
        assert_eq!(format_duration(StdDuration::from_secs(3600)), "1h");
        assert_eq!(format_duration(StdDuration::ZERO), "0s");
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,40}") {
            let _ = parse_duration(&s);
        }

        #[test]
        fn format_then_parse_round_trips(ms in 0u64..(366 * 24 * 3600 * 1000)) {
            let d = StdDuration::from_millis(ms);
            proptest::prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }

        #[test]
        fn pattern_and_parser_agree(s in "[0-9.a-z]{1,12}") {
            let re_ok = pattern_matches(&s);
            let parsed = parse_duration(&s);
            // Whatever the schema admits, the parser reads (unless it is too long).
            if re_ok {
                proptest::prop_assert!(
                    matches!(parsed, Ok(_) | Err(DurationError::TooLong(_))),
                    "{s}: {parsed:?}"
                );
            }
        }
    }

    /// Hostile input (issue 8): any text is either a duration within [`MAX_DURATION`] or an
    /// error whose message quotes the input, so a user can see what was refused.
    mod hostile {
        use super::*;
        use proptest::prelude::*;

        /// One `<number><unit>` group and its length in nanoseconds.
        fn group() -> impl Strategy<Value = (String, u128)> {
            (
                0u64..100_000,
                proptest::option::of(0u32..1000),
                prop_oneof![Just("ms"), Just("s"), Just("m"), Just("h")],
            )
                .prop_map(|(int, frac, unit)| {
                    let per: u128 = match unit {
                        "ms" => 1_000_000,
                        "s" => 1_000_000_000,
                        "m" => 60_000_000_000,
                        _ => 3_600_000_000_000,
                    };
                    let mut nanos = u128::from(int) * per;
                    let text = match frac {
                        Some(f) => {
                            // Three fractional digits: f/1000 of a unit.
                            nanos += u128::from(f) * per / 1000;
                            format!("{int}.{f:03}{unit}")
                        }
                        None => format!("{int}{unit}"),
                    };
                    (text, nanos)
                })
        }

        proptest! {
            #[test]
            fn any_text_parses_within_bounds_or_names_itself_in_the_error(s in "\\PC{0,48}") {
                match parse_duration(&s) {
                    Ok(d) => prop_assert!(d <= MAX_DURATION, "{s:?} -> {d:?}"),
                    Err(DurationError::Empty) => prop_assert!(s.trim().is_empty()),
                    Err(e) => {
                        let msg = e.to_string();
                        prop_assert!(msg.contains(&format!("{s:?}")), "{msg} does not quote {s:?}");
                    }
                }
            }

            #[test]
            fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
                let s = String::from_utf8_lossy(&bytes);
                let _ = parse_duration(&s);
                // Through serde, as a manifest field: deserializing never fails on a string,
                // parsing happens on demand.
                let d: Duration = serde_json::from_value(serde_json::Value::String(s.into_owned())).unwrap();
                let _ = d.get();
            }

            #[test]
            fn composed_groups_sum_exactly(groups in proptest::collection::vec(group(), 1..5)) {
                let text: String = groups.iter().map(|(t, _)| t.as_str()).collect();
                let want: u128 = groups.iter().map(|(_, n)| n).sum();
                match parse_duration(&text) {
                    Ok(d) => {
                        prop_assert_eq!(d.as_nanos(), want, "{}", text);
                        prop_assert!(pattern_matches(&text));
                    }
                    Err(DurationError::TooLong(_)) => prop_assert!(want > MAX_DURATION.as_nanos()),
                    Err(e) => prop_assert!(false, "{text}: {e}"),
                }
            }

            #[test]
            fn a_sign_or_a_missing_unit_is_refused(n in 0u64..1_000_000, sign in prop_oneof![Just("-"), Just("+")]) {
                let signed = format!("{sign}{n}s");
                prop_assert!(matches!(parse_duration(&signed), Err(DurationError::Syntax(_))));
                let bare = n.to_string();
                prop_assert!(matches!(parse_duration(&bare), Err(DurationError::Unit(_))));
            }
        }
    }

    /// A hand-written matcher for DURATION_PATTERN, so the test does not need a regex crate.
    fn pattern_matches(s: &str) -> bool {
        let b = s.as_bytes();
        let mut i = 0;
        if b.is_empty() {
            return false;
        }
        while i < b.len() {
            let st = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            if i == st {
                return false;
            }
            if i < b.len() && b[i] == b'.' {
                i += 1;
                let fs = i;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
                if i == fs {
                    return false;
                }
            }
            let rest = &s[i..];
            if rest.starts_with("ms") {
                i += 2;
            } else if rest.starts_with('s') || rest.starts_with('m') || rest.starts_with('h') {
                i += 1;
            } else {
                return false;
            }
        }
        true
    }
}
