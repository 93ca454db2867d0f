//! A reader of the Prometheus text exposition format (0.0.4) and OpenMetrics 1.0, enough to
//! check a worker's `/metrics`: `# TYPE` lines and samples with their labels.

use std::collections::{BTreeMap, HashMap};

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    /// The sample's metric name (a counter's ends in `_total`).
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// A parsed exposition.
#[derive(Debug, Clone, Default)]
pub(crate) struct Exposition {
    /// Family name → declared type. A counter family is keyed without `_total`, whichever
    /// format declared it (OpenMetrics declares `x`, the text format `x_total`).
    pub types: HashMap<String, String>,
    /// Every sample.
    pub samples: Vec<Sample>,
}

impl Exposition {
    /// The samples of the family `name` (for a counter, give the name without `_total`).
    pub fn family<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples
            .iter()
            .filter(move |s| s.name == name || s.name.strip_suffix("_total") == Some(name))
    }
}

/// Parses `text`, or says which line is not valid.
pub(crate) fn parse(text: &str) -> Result<Exposition, String> {
    let mut out = Exposition::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        let at = |why: &str| format!("line {}: {why}: {line:?}", i + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let mut words = rest.split_whitespace();
            if words.next() == Some("TYPE") {
                let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                    return Err(at("a TYPE line needs a name and a type"));
                };
                let family = if kind == "counter" {
                    name.strip_suffix("_total").unwrap_or(name)
                } else {
                    name
                };
                out.types.insert(family.to_owned(), kind.to_owned());
            }
            continue;
        }
        out.samples.push(sample(line).map_err(|why| at(&why))?);
    }
    Ok(out)
}

fn sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .ok_or("no value")?;
    let name = &line[..name_end];
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    {
        return Err(format!("invalid metric name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(body) = rest.strip_prefix('{') {
        let (parsed, after) = label_set(body)?;
        labels = parsed;
        rest = after;
    }
    let value = rest.split_whitespace().next().ok_or("no value")?;
    let value = match value {
        "NaN" => f64::NAN,
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().map_err(|_| format!("invalid value {v:?}"))?,
    };
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Reads `k="v",...}` and returns the labels and what follows the `}`.
fn label_set(mut s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    loop {
        s = s.trim_start();
        if let Some(after) = s.strip_prefix('}') {
            return Ok((labels, after));
        }
        let eq = s.find('=').ok_or("a label without '='")?;
        let key = s[..eq].trim();
        if key.is_empty() {
            return Err("an empty label name".into());
        }
        s = s[eq + 1..]
            .trim_start()
            .strip_prefix('"')
            .ok_or("a label value must be quoted")?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err("an unterminated label value".into()),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    _ => return Err("an invalid escape in a label value".into()),
                },
                Some((_, c)) => value.push(c),
            }
        };
        if labels.insert(key.to_owned(), value).is_some() {
            return Err(format!("label {key:?} given twice"));
        }
        s = s[end + 1..].trim_start();
        if let Some(after) = s.strip_prefix(',') {
            s = after;
        } else if !s.starts_with('}') {
            return Err("labels must be separated by ','".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_formats_declare_counters_under_one_family_name() {
        let om = parse(
            "# TYPE backpressure_outcomes counter\n\
             backpressure_outcomes_total{workload=\"w\",class=\"success\"} 3\n# EOF\n",
        )
        .unwrap();
        let text = parse(
            "# HELP backpressure_outcomes_total Outcomes\n\
             # TYPE backpressure_outcomes_total counter\n\
             backpressure_outcomes_total{class=\"success\",workload=\"w\"} 3 1700000000000\n",
        )
        .unwrap();
        for e in [om, text] {
            assert_eq!(e.types["backpressure_outcomes"], "counter");
            let s: Vec<_> = e.family("backpressure_outcomes").collect();
            assert_eq!(s.len(), 1);
            assert_eq!(s[0].labels["class"], "success");
            assert_eq!(s[0].value, 3.0);
        }
    }

    #[test]
    fn label_values_keep_commas_braces_and_escapes() {
        let e = parse(r#"m{a="x,y}",b="q\"\\\n"} NaN"#).unwrap();
        let s = &e.samples[0];
        assert_eq!(s.labels["a"], "x,y}");
        assert_eq!(s.labels["b"], "q\"\\\n");
        assert!(s.value.is_nan());
    }

    #[test]
    fn malformed_lines_are_named() {
        for bad in [
            "m{a=\"x\" 1",
            "m{a=x} 1",
            "m{a=\"x\",a=\"y\"} 1",
            "m one",
            "m",
            "9-bad 1",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.starts_with("line 1"), "{bad}: {err}");
        }
    }
}
