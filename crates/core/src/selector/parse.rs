//! The string form of a label selector, as the API server writes it into `/scale`
//! `status.selector`: comma-separated requirements, `k=v`, `k==v`, `k!=v`, `k in (a,b)`,
//! `k notin (a,b)`, `k`, `!k`.

use super::Requirement;

/// Parses the string form into its requirements; the error names the offending part.
pub(super) fn requirements(text: &str) -> Result<Vec<Requirement>, String> {
    let mut reqs = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        // One requirement runs to the next comma outside parentheses.
        let mut depth = 0;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        let part = rest[..end].trim();
        rest = rest.get(end + 1..).unwrap_or("").trim();
        reqs.push(parse_requirement(part)?);
    }
    Ok(reqs)
}

/// A label key: `[prefix/]name` of letters, digits, `-`, `_` and `.` (the API server checks the
/// exact DNS rules; this only refuses what cannot be a key, with a message that says so).
fn label_key(part: &str, key: &str) -> Result<String, String> {
    let key = key.trim();
    if key.is_empty() {
        return Err(format!("empty label key in {part:?}"));
    }
    let ok = key.len() <= 317
        && key.matches('/').count() <= 1
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if !ok {
        return Err(format!("invalid label key {key:?} in {part:?}"));
    }
    Ok(key.to_owned())
}

/// A label value: empty, or up to 63 letters, digits, `-`, `_` and `.`.
fn label_value(part: &str, value: &str) -> Result<String, String> {
    let value = value.trim();
    let ok = value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        return Err(format!("invalid label value {value:?} in {part:?}"));
    }
    Ok(value.to_owned())
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    if part.is_empty() {
        return Err("empty requirement".into());
    }
    if let Some(k) = part.strip_prefix('!') {
        return Ok(Requirement::NotExists(label_key(part, k)?));
    }
    if let Some((k, v)) = part.split_once("!=") {
        return Ok(Requirement::NotEq(
            label_key(part, k)?,
            label_value(part, v)?,
        ));
    }
    if let Some((k, v)) = part.split_once("==") {
        return Ok(Requirement::Eq(label_key(part, k)?, label_value(part, v)?));
    }
    if let Some((k, v)) = part.split_once('=') {
        return Ok(Requirement::Eq(label_key(part, k)?, label_value(part, v)?));
    }
    let words: Vec<&str> = part.splitn(2, char::is_whitespace).collect();
    if words.len() == 2 {
        let key = label_key(part, words[0])?;
        let rest = words[1].trim();
        let (op, set) = if let Some(s) = rest.strip_prefix("notin") {
            ("notin", s)
        } else if let Some(s) = rest.strip_prefix("in") {
            ("in", s)
        } else {
            return Err(format!("unknown operator in {part:?}"));
        };
        let set = set.trim();
        let inner = set
            .strip_prefix('(')
            .and_then(|s| s.strip_suffix(')'))
            .ok_or_else(|| format!("expected (values) in {part:?}"))?;
        let values: Vec<String> = inner
            .split(',')
            .map(|v| label_value(part, v))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .filter(|v| !v.is_empty())
            .collect();
        if values.is_empty() {
            return Err(format!("empty value set in {part:?}"));
        }
        return Ok(if op == "in" {
            Requirement::In(key, values)
        } else {
            Requirement::NotIn(key, values)
        });
    }
    Ok(Requirement::Exists(label_key(part, part)?))
}
