//! RFC 8785, the JSON Canonicalization Scheme (JCS): the one byte string of a JSON value that
//! the content hash of the wire contract is computed over.
//!
//! - objects: members sorted by their names compared as sequences of UTF-16 code units, no
//!   whitespace anywhere;
//! - strings: UTF-8, escaped only where JSON requires it (`"`, `\`, and the control characters
//!   below U+0020: `\b`, `\t`, `\n`, `\f`, `\r` by name, the others as `\u00xx` in lowercase
//!   hex); everything else, `/` and U+2028 included, is written as is;
//! - numbers: every number is an IEEE 754 double written as ECMAScript's
//!   `Number.prototype.toString` writes it (`1.0` is `1`, `0.05` is `0.05`, `1e21` is
//!   `1e+21`, `1e-7` is `1e-7`, `-0` is `0`); NaN and the infinities are not JSON and are
//!   refused. An integer beyond 2^53 becomes the nearest double, as in JavaScript.
//! - `true`, `false`, `null` as themselves.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

/// Why a value has no canonical form.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JcsError {
    /// NaN or an infinity: not representable in JSON.
    #[error("{0} is not a JSON number")]
    NotANumber(f64),
    /// The value could not be turned into JSON at all.
    #[error("not serializable as JSON: {0}")]
    Serialize(String),
}

/// The canonical form of `value`.
pub fn to_string<T: Serialize + ?Sized>(value: &T) -> Result<String, JcsError> {
    let value = serde_json::to_value(value).map_err(|e| JcsError::Serialize(e.to_string()))?;
    canonicalize(&value)
}

/// The canonical form of a parsed JSON value.
pub fn canonicalize(value: &Value) -> Result<String, JcsError> {
    let mut out = String::new();
    write_value(&mut out, value)?;
    Ok(out)
}

fn write_value(out: &mut String, value: &Value) -> Result<(), JcsError> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            // Every JSON number is a double to JCS, integers included (u64 and i64 beyond 2^53
            // round to the nearest one, as JavaScript's JSON.parse does).
            let f = match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => u as f64,
                (None, Some(i), _) => i as f64,
                (None, None, Some(f)) => f,
                (None, None, None) => f64::NAN,
            };
            out.push_str(&format_number(f)?);
        }
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item)?;
            }
            out.push(']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
            sorted.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (i, (name, member)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, name);
                out.push(':');
                write_value(out, member)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

/// A JSON string with the minimal escapes of RFC 8785 (section 3.2.2.2).
fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{0C}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if u32::from(c) < 0x20 => {
                // Writing into a String cannot fail.
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `value` as ECMAScript's `Number.prototype.toString` writes it (ECMA-262, Number::toString
/// with radix 10), which RFC 8785 adopts: the shortest digits that read back as the same
/// double, in plain notation for decimal exponents from -6 to 20, else in exponent notation
/// with an explicit sign.
pub fn format_number(value: f64) -> Result<String, JcsError> {
    if !value.is_finite() {
        return Err(JcsError::NotANumber(value));
    }
    if value == 0.0 {
        // Both zeros.
        return Ok("0".to_owned());
    }
    // Ryu writes the shortest digits that read back as the same double and, among those, the
    // closest to it, ties to even: ECMAScript's choice. (Rust's own `{:e}` does not break ties
    // to even: 1424953923781206.25 comes out as ...206.3, ECMAScript's is ...206.2.)
    let mut buffer = ryu::Buffer::new();
    let (digits, n) = decimal_digits(buffer.format_finite(value.abs()))?;
    // ECMA-262's names: the value is 0.digits × 10^n, with k digits.
    let k = digits.len() as i32;
    let mut out = String::with_capacity(26);
    if value < 0.0 {
        out.push('-');
    }
    if k <= n && n <= 21 {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        let (int, frac) = digits.split_at(n as usize);
        out.push_str(int);
        out.push('.');
        out.push_str(frac);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(&digits);
    } else {
        let (first, rest) = digits.split_at(1);
        out.push_str(first);
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        let e = n - 1;
        let _ = write!(out, "e{}{}", if e < 0 { '-' } else { '+' }, e.abs());
    }
    Ok(out)
}

/// The significant digits of a positive decimal number (`123.45`, `1e-7`, `1.5e16`, `100.0`),
/// without leading or trailing zeros, and `n` such that the number is `0.digits × 10^n`.
fn decimal_digits(text: &str) -> Result<(String, i32), JcsError> {
    let bad = || JcsError::Serialize(format!("unexpected float format {text:?}"));
    let (mantissa, exp) = match text.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i32>().map_err(|_| bad())?),
        None => (text, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if !(int.bytes().chain(frac.bytes())).all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let all = format!("{int}{frac}");
    let leading = all.len() - all.trim_start_matches('0').len();
    let digits = all.trim_start_matches('0').trim_end_matches('0').to_owned();
    if digits.is_empty() {
        return Err(bad());
    }
    let n = int.len() as i32 - leading as i32 + exp;
    Ok((digits, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// RFC 8785 appendix B: IEEE 754 bit patterns and their canonical form.
    #[test]
    fn rfc_8785_number_examples() {
        let cases: [(u64, &str); 24] = [
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ];
        for (bits, want) in cases {
            let f = f64::from_bits(bits);
            assert_eq!(format_number(f).unwrap(), want, "{bits:#018x} ({f:e})");
        }
        for bits in [
            0x7fffffffffffffff_u64,
            0x7ff0000000000000,
            0xfff0000000000000,
        ] {
            let f = f64::from_bits(bits);
            assert!(
                matches!(format_number(f), Err(JcsError::NotANumber(_))),
                "{f}"
            );
        }
    }

    /// Where serde_json and ECMAScript disagree, and the boundaries of plain notation.
    #[test]
    fn numbers_as_javascript_writes_them() {
        for (f, want) in [
            (1.0, "1"),
            (-1.0, "-1"),
            (0.1, "0.1"),
            (0.05, "0.05"),
            (1e-7, "1e-7"),
            (1.5e-7, "1.5e-7"),
            (0.000001, "0.000001"),
            (0.0000015, "0.0000015"),
            (1e20, "100000000000000000000"),
            (1e21, "1e+21"),
            (1.5e21, "1.5e+21"),
            (123456789012345680000.0, "123456789012345680000"),
            (60000.0, "60000"),
            (0.9, "0.9"),
            (0.25, "0.25"),
            (2.5, "2.5"),
        ] {
            assert_eq!(format_number(f).unwrap(), want, "{f:?}");
        }
        // serde_json spells whole doubles otherwise (the reason the hash moved to JCS).
        assert_eq!(serde_json::to_string(&1.0_f64).unwrap(), "1.0");
        assert_eq!(serde_json::to_string(&0.0_f64).unwrap(), "0.0");
    }

    /// Integers are doubles to JCS: exact up to 2^53, the nearest double beyond.
    #[test]
    fn integers_are_doubles() {
        assert_eq!(
            canonicalize(&json!(9007199254740991_u64)).unwrap(),
            "9007199254740991"
        );
        assert_eq!(canonicalize(&json!(-42_i64)).unwrap(), "-42");
        assert_eq!(
            canonicalize(&json!(u64::MAX)).unwrap(),
            "18446744073709552000"
        );
        assert_eq!(
            canonicalize(&json!(i64::MIN)).unwrap(),
            "-9223372036854776000"
        );
    }

    /// RFC 8785 section 3.2.3: members sorted by UTF-16 code units (the emoji, a surrogate pair
    /// starting 0xD83D, sorts before U+FB33 although its code point is larger).
    #[test]
    fn rfc_8785_key_order() {
        let input = r#"{
            "\u20ac": "Euro Sign",
            "\r": "Carriage Return",
            "\ufb33": "Hebrew Letter Dalet With Dagesh",
            "1": "One",
            "\ud83d\ude00": "Emoji: Grinning Face",
            "\u0080": "Control",
            "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        let value: Value = serde_json::from_str(input).unwrap();
        assert_eq!(
            canonicalize(&value).unwrap(),
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
             \"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\
             \"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
        );
    }

    /// RFC 8785 section 3.2.2's example, parsed and canonicalized.
    #[test]
    fn rfc_8785_example() {
        let input = r#"{
            "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
            "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
            "literals": [null, true, false]
        }"#;
        let value: Value = serde_json::from_str(input).unwrap();
        assert_eq!(
            canonicalize(&value).unwrap(),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    #[test]
    fn strings_escape_only_what_json_requires() {
        let s = "\u{0}\u{1}\u{8}\t\n\u{b}\u{c}\r\u{1f} \u{7f}/\u{2028}é\"\\";
        assert_eq!(
            canonicalize(&json!(s)).unwrap(),
            "\"\\u0000\\u0001\\b\\t\\n\\u000b\\f\\r\\u001f \u{7f}/\u{2028}é\\\"\\\\\""
        );
    }

    #[test]
    fn nested_values_have_no_whitespace() {
        let v = json!({"b": [1.0, {"z": null, "a": true}], "a": {}, "c": []});
        assert_eq!(
            canonicalize(&v).unwrap(),
            r#"{"a":{},"b":[1,{"a":true,"z":null}],"c":[]}"#
        );
    }

    proptest::proptest! {
        /// The canonical form of any finite double reads back as the same double (the digits
        /// are never lossy), and is what serde_json's parser reads it as.
        #[test]
        fn numbers_round_trip(bits in proptest::num::u64::ANY) {
            let f = f64::from_bits(bits);
            if f.is_finite() {
                let s = format_number(f).unwrap();
                let back: f64 = s.parse().unwrap();
                proptest::prop_assert_eq!(back, if f == 0.0 { 0.0 } else { f });
                // No more digits than Rust's shortest representation.
                let rust_digits = format!("{:e}", f.abs()).split('e').next().unwrap().replace('.', "").len();
                let ours = s.split('e').next().unwrap().trim_start_matches('-').replace('.', "");
                let ours = ours.trim_start_matches('0').trim_end_matches('0');
                proptest::prop_assert!(ours.len() <= rust_digits, "{} vs {:e}", s, f);
            }
        }
    }
}
