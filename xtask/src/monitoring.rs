//! The PromQL that rtprobe ships outside its rule files: the Grafana
//! dashboard's (deploy/grafana/) and the docs' queries (docs/*.md), found
//! and made checkable. `cargo xtask test` checks the dashboard's shape
//! here, then has promtool parse every expression (written as recording
//! rules into a temporary rule file); tests/monitoring.rs (which includes
//! this file) checks that every metric they name exists among the
//! exporter's families or the recording rules. Only std and serde_json:
//! both crates build it.

#![allow(dead_code)]

use std::collections::{BTreeSet, HashSet};

use serde_json::Value;

/// The scrape interval deploy/prometheus/prometheus.yml ships; every range
/// window must span at least [`MIN_SCRAPES_PER_WINDOW`] of them.
pub const SCRAPE_INTERVAL_S: f64 = 15.0;
pub const MIN_SCRAPES_PER_WINDOW: f64 = 4.0;

/// Grafana's own variables, and what they stand for in a check.
const GRAFANA_BUILTINS: [(&str, &str); 4] = [
    ("__rate_interval", "1m"),
    ("__interval", "1m"),
    ("__range", "1h"),
    ("__all", "x"),
];

/// One expression and where it was found (for error messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expr {
    pub origin: String,
    pub promql: String,
}

/// Checks the dashboard's shape (every panel with an id, a type, a
/// gridPos inside 24 columns and not over another; every query panel with
/// a datasource and targets that have a refId and an expr; variables
/// unique and every `$var` defined) and returns its PromQL, Grafana's
/// variables substituted: the panels' exprs and the query variables'
/// selectors (`label_values(SELECTOR, label)`).
pub fn dashboard_exprs(json: &str) -> Result<Vec<Expr>, String> {
    let d: Value = serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
    for key in ["title", "uid", "schemaVersion", "panels", "templating"] {
        if d.get(key).is_none() {
            return Err(format!("no top-level {key:?}"));
        }
    }
    let vars = variables(&d)?;
    let mut out = Vec::new();
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        let name = v["name"].as_str().unwrap_or("?");
        if v["type"] == "query" {
            check_datasource(&v["datasource"], &vars)
                .map_err(|e| format!("variable {name}: {e}"))?;
            let q = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .unwrap_or("");
            check_vars(q, &vars).map_err(|e| format!("variable {name}: {e}"))?;
            if let Some(sel) = variable_selector(q) {
                out.push(Expr {
                    origin: format!("variable {name}"),
                    promql: substitute(&sel),
                });
            }
        }
    }
    let panels = all_panels(&d);
    check_layout(&panels)?;
    for p in panels {
        out.extend(panel_exprs(p, &vars)?);
    }
    Ok(out)
}

/// The template variables' names; the first must be the Prometheus
/// datasource that panels and queries name as `${datasource}`.
fn variables(d: &Value) -> Result<HashSet<String>, String> {
    let list = d["templating"]["list"]
        .as_array()
        .ok_or("templating.list is no array")?;
    let mut names = HashSet::new();
    for v in list {
        let name = v["name"].as_str().ok_or("a variable without a name")?;
        if !names.insert(name.to_string()) {
            return Err(format!("variable {name} is defined twice"));
        }
        if v["type"] == "datasource" && v["query"] != "prometheus" {
            return Err(format!(
                "variable {name}: a datasource variable of type {}, not prometheus",
                v["query"]
            ));
        }
    }
    Ok(names)
}

/// Every panel, those inside rows too.
fn all_panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().into_iter().flatten() {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

/// Unique ids, grid positions inside the 24 columns, no two overlapping.
fn check_layout(panels: &[&Value]) -> Result<(), String> {
    let mut ids = HashSet::new();
    let mut boxes: Vec<(i64, [i64; 4])> = Vec::new();
    for p in panels {
        let id = p["id"]
            .as_i64()
            .ok_or_else(|| format!("panel {:?} has no integer id", p["title"]))?;
        if !ids.insert(id) {
            return Err(format!("panel id {id} is used twice"));
        }
        if p["type"].as_str().is_none_or(str::is_empty) || p["title"].as_str().is_none() {
            return Err(format!("panel {id} has no type or title"));
        }
        let g = &p["gridPos"];
        let [h, w, x, y] = ["h", "w", "x", "y"].map(|k| g[k].as_i64().unwrap_or(-1));
        if h < 1 || w < 1 || x < 0 || y < 0 || x + w > 24 {
            return Err(format!(
                "panel {id}: gridPos {g} is not inside the 24 columns"
            ));
        }
        let b = [x, y, x + w, y + h];
        if let Some((other, _)) = boxes
            .iter()
            .find(|(_, o)| b[0] < o[2] && o[0] < b[2] && b[1] < o[3] && o[1] < b[3])
        {
            return Err(format!("panel {id} overlaps panel {other}"));
        }
        boxes.push((id, b));
    }
    Ok(())
}

/// A query panel's exprs, checked: a datasource, targets with unique
/// refIds, defined variables.
fn panel_exprs(p: &Value, vars: &HashSet<String>) -> Result<Vec<Expr>, String> {
    let id = p["id"].as_i64().unwrap_or(-1);
    check_vars(p["title"].as_str().unwrap_or(""), vars)
        .map_err(|e| format!("panel {id} title: {e}"))?;
    if p["type"] == "row" {
        return Ok(Vec::new());
    }
    check_datasource(&p["datasource"], vars).map_err(|e| format!("panel {id}: {e}"))?;
    if let Some(r) = p["repeat"].as_str()
        && !vars.contains(r)
    {
        return Err(format!("panel {id} repeats over {r}, which is no variable"));
    }
    let targets = p["targets"]
        .as_array()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| format!("panel {id} has no targets"))?;
    let mut refs = HashSet::new();
    let mut out = Vec::new();
    for t in targets {
        let r = t["refId"]
            .as_str()
            .ok_or_else(|| format!("panel {id}: a target without refId"))?;
        let expr = t["expr"].as_str().filter(|e| !e.trim().is_empty());
        let expr = expr.ok_or_else(|| format!("panel {id} target {r}: no expr"))?;
        if !refs.insert(r) {
            return Err(format!("panel {id}: refId {r} twice"));
        }
        check_vars(expr, vars).map_err(|e| format!("panel {id} target {r}: {e}"))?;
        check_vars(t["legendFormat"].as_str().unwrap_or(""), vars)
            .map_err(|e| format!("panel {id} target {r}: {e}"))?;
        out.push(Expr {
            origin: format!(
                "panel {id} ({}) target {r}",
                p["title"].as_str().unwrap_or("")
            ),
            promql: substitute(expr),
        });
    }
    Ok(out)
}

fn check_datasource(ds: &Value, vars: &HashSet<String>) -> Result<(), String> {
    let uid = ds["uid"].as_str().ok_or("no datasource")?;
    if ds["type"] != "prometheus" {
        return Err(format!("datasource of type {}, not prometheus", ds["type"]));
    }
    check_vars(uid, vars)?;
    if !uid.contains('$') {
        return Err(format!(
            "datasource uid {uid:?} is fixed: use ${{datasource}}"
        ));
    }
    Ok(())
}

/// The names of `$var`, `${var}` and `${var:fmt}` in `text`.
fn used_vars(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        rest = &rest[i + 1..];
        let braced = rest.starts_with('{');
        let body = if braced { &rest[1..] } else { rest };
        let end = body
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(body.len());
        if end > 0 {
            out.push(body[..end].to_string());
        }
    }
    out
}

fn check_vars(text: &str, vars: &HashSet<String>) -> Result<(), String> {
    for v in used_vars(text) {
        if !vars.contains(&v) && !GRAFANA_BUILTINS.iter().any(|(b, _)| *b == v) {
            return Err(format!("${v} is no variable of the dashboard"));
        }
    }
    Ok(())
}

/// `label_values(SELECTOR, label)` -> SELECTOR; `query_result(EXPR)` ->
/// EXPR; `label_values(label)` and the rest name no series.
fn variable_selector(q: &str) -> Option<String> {
    let q = q.trim();
    if let Some(inner) = q
        .strip_prefix("query_result(")
        .and_then(|r| r.strip_suffix(')'))
    {
        return Some(inner.to_string());
    }
    let inner = q.strip_prefix("label_values(")?.strip_suffix(')')?;
    let comma = inner.rfind(',')?;
    Some(inner[..comma].trim().to_string())
}

/// Grafana's variables replaced by values PromQL parses: a range
/// variable by a duration, any other by "x" (inside a matcher's string).
pub fn substitute(expr: &str) -> String {
    let mut s = expr.to_string();
    for (name, value) in GRAFANA_BUILTINS {
        s = s
            .replace(&format!("${{{name}}}"), value)
            .replace(&format!("${name}"), value);
    }
    for v in used_vars(&s) {
        s = s
            .replace(&format!("${{{v}}}"), "x")
            .replace(&format!("${v}"), "x");
    }
    s
}

/// The PromQL of a Markdown document: each ```promql block (one
/// expression), and each `promtool query instant URL 'EXPR'` in any other
/// fenced block (the expression in single quotes, lines joined).
pub fn doc_queries(origin: &str, markdown: &str) -> Vec<Expr> {
    let mut out = Vec::new();
    let mut block: Option<(String, usize, String)> = None;
    for (n, line) in markdown.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        match (&mut block, fence) {
            (None, true) => {
                block = Some((
                    line.trim_start()[3..].trim().to_string(),
                    n + 1,
                    String::new(),
                ))
            }
            (Some((lang, start, text)), true) => {
                let at = format!("{origin}:{start}");
                if lang == "promql" {
                    out.push(Expr {
                        origin: at,
                        promql: text.trim().to_string(),
                    });
                } else {
                    out.extend(promtool_queries(text).into_iter().map(|q| Expr {
                        origin: at.clone(),
                        promql: q,
                    }));
                }
                block = None;
            }
            (Some((_, _, text)), false) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, false) => {}
        }
    }
    out
}

/// The single-quoted expression after each `promtool query instant URL`.
fn promtool_queries(shell: &str) -> Vec<String> {
    let joined = shell.replace("\\\n", " ");
    let mut out = Vec::new();
    for (i, _) in joined.match_indices("promtool query instant") {
        let rest = &joined[i..];
        if let Some(open) = rest.find('\'')
            && let Some(len) = rest[open + 1..].find('\'')
        {
            out.push(
                rest[open + 1..open + 1 + len]
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" "),
            );
        }
    }
    out
}

/// Every range window of an expression (`[1m]`, a subquery's `[1h:1m]`
/// range), in seconds; an error for one PromQL would refuse.
pub fn windows_s(promql: &str) -> Result<Vec<f64>, String> {
    let mut out = Vec::new();
    let mut rest = skip_strings(promql);
    while let Some(i) = rest.find('[') {
        let end = rest[i..].find(']').ok_or("an unclosed [")? + i;
        let range = rest[i + 1..end].split(':').next().unwrap_or("").trim();
        out.push(duration_s(range).ok_or_else(|| format!("[{range}] is no duration"))?);
        rest = rest[end + 1..].to_string();
    }
    Ok(out)
}

/// A PromQL duration (`90s`, `1h30m`, `1m`) in seconds.
fn duration_s(d: &str) -> Option<f64> {
    let mut total = 0.0;
    let mut num = String::new();
    let mut chars = d.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let unit = if c == 'm' && chars.peek() == Some(&'s') {
            chars.next();
            0.001
        } else {
            match c {
                's' => 1.0,
                'm' => 60.0,
                'h' => 3600.0,
                'd' => 86400.0,
                'w' => 604_800.0,
                'y' => 31_536_000.0,
                _ => return None,
            }
        };
        total += num.parse::<f64>().ok()? * unit;
        num.clear();
    }
    (num.is_empty() && total > 0.0).then_some(total)
}

/// The text with string literals emptied (their brackets are no windows,
/// their words no metric names).
fn skip_strings(promql: &str) -> String {
    let mut out = String::with_capacity(promql.len());
    let mut quote = None;
    let mut escaped = false;
    for c in promql.chars() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                    out.push(c);
                }
            }
            None => {
                if matches!(c, '"' | '\'' | '`') {
                    quote = Some(c);
                }
                out.push(c);
            }
        }
    }
    out
}

/// The metric names an expression selects: the identifiers that are not a
/// function or aggregation (followed by `(`), a keyword, a label name (in
/// `{}`, or in the list after by/without/on/ignoring/group_*), a number
/// or a duration.
pub fn metric_names(promql: &str) -> BTreeSet<String> {
    const KEYWORDS: [&str; 7] = ["and", "or", "unless", "bool", "offset", "inf", "nan"];
    const LABEL_LISTS: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let text = skip_strings(promql);
    let b = text.as_bytes();
    let mut names = BTreeSet::new();
    let (mut i, mut depth_braces, mut depth_brackets) = (0, 0, 0);
    let mut skip_list = false;
    while i < b.len() {
        let c = b[i] as char;
        let ident_start = c.is_ascii_alphabetic() || c == '_' || c == ':';
        if !ident_start {
            match c {
                '{' => depth_braces += 1,
                '}' => depth_braces -= 1,
                '[' => depth_brackets += 1,
                ']' => depth_brackets -= 1,
                ')' => skip_list = false,
                _ => {}
            }
            // Numbers and durations (1e6, 0.5, 5m) are not names.
            if c.is_ascii_digit() || c == '.' {
                while i + 1 < b.len() && (b[i + 1] as char).is_ascii_alphanumeric() {
                    i += 1;
                }
            }
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len()
            && ((b[i] as char).is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':')
        {
            i += 1;
        }
        let word = &text[start..i];
        let next = text[i..].trim_start().chars().next();
        if LABEL_LISTS.contains(&word) {
            skip_list = next == Some('(');
            continue;
        }
        // `sum(`, and `sum by (...) (` / `sum without (...) (`.
        let after = text[i..].trim_start();
        let is_call = next == Some('(')
            || ["by ", "by(", "without ", "without("]
                .iter()
                .any(|k| after.starts_with(k));
        if depth_braces == 0
            && depth_brackets == 0
            && !skip_list
            && !is_call
            && !KEYWORDS.contains(&word)
        {
            names.insert(word.to_string());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_selectors_not_functions_labels_or_numbers() {
        let e = r#"histogram_quantile(0.99, sum by (target, le) (rate(rtprobe_rtt_seconds_bucket{job="a:b", le!="1e6"}[1m])))
            / on (instance) group_left (site) up{job="rtprobe"} > bool 0.5 unless ALERTS offset 5m
            and target:rtprobe_peers:count * 1e-6"#;
        let got: Vec<String> = metric_names(e).into_iter().collect();
        assert_eq!(
            got,
            [
                "ALERTS",
                "rtprobe_rtt_seconds_bucket",
                "target:rtprobe_peers:count",
                "up"
            ]
        );
    }

    #[test]
    fn windows_and_variables() {
        assert_eq!(
            windows_s("rate(x[1m]) + max_over_time(y[1h:30s]) + z{a=\"[6s]\"}").unwrap(),
            [60.0, 3600.0]
        );
        assert_eq!(windows_s("increase(x[1m30s])").unwrap(), [90.0]);
        assert!(windows_s("rate(x[soon])").is_err());
        assert_eq!(
            substitute("rate(a{i=~\"$instance\", t=~\"${target}\"}[$__rate_interval])"),
            "rate(a{i=~\"x\", t=~\"x\"}[1m])"
        );
        assert_eq!(
            variable_selector("label_values(up{job=\"rtprobe\"}, site)").as_deref(),
            Some("up{job=\"rtprobe\"}")
        );
        assert_eq!(variable_selector("label_values(site)"), None);
    }

    #[test]
    fn docs_give_promql_blocks_and_promtool_queries() {
        let md = "text\n```promql\nsum(rate(a[1m]))\n```\n\n```sh\nip netns exec mon promtool query instant http://x:9090 \\\n   'increase(b[1m]) > 0'\necho 'not this'\n```\n";
        let q = doc_queries("d.md", md);
        assert_eq!(
            q,
            [
                Expr {
                    origin: "d.md:2".into(),
                    promql: "sum(rate(a[1m]))".into()
                },
                Expr {
                    origin: "d.md:6".into(),
                    promql: "increase(b[1m]) > 0".into()
                },
            ]
        );
    }

    #[test]
    fn a_broken_dashboard_is_refused() {
        let ok = r#"{"title":"t","uid":"u","schemaVersion":39,
          "templating":{"list":[{"name":"datasource","type":"datasource","query":"prometheus"},
            {"name":"v","type":"query","datasource":{"type":"prometheus","uid":"${datasource}"},"query":{"query":"label_values(up, v)"}}]},
          "panels":[{"id":1,"type":"timeseries","title":"a $v","gridPos":{"h":4,"w":12,"x":0,"y":0},
            "datasource":{"type":"prometheus","uid":"${datasource}"},"targets":[{"refId":"A","expr":"up{v=~\"$v\"}"}]}]}"#;
        let e = dashboard_exprs(ok).unwrap();
        assert_eq!(
            e.iter().map(|e| e.promql.as_str()).collect::<Vec<_>>(),
            ["up", "up{v=~\"x\"}"]
        );
        for (bad, why) in [
            (ok.replace("a $v", "a $w"), "$w is no variable"),
            (ok.replace("=~\\\"$v", "=~\\\"${w}"), "$w is no variable"),
            (
                ok.replace("\"x\":0", "\"x\":13"),
                "not inside the 24 columns",
            ),
            (
                ok.replace(
                    "\"uid\":\"${datasource}\"},\"targets",
                    "\"uid\":\"abc\"},\"targets",
                ),
                "is fixed",
            ),
            (
                ok.replace(
                    "\"targets\":[{\"refId\":\"A\",\"expr\":\"up{v=~\\\"$v\\\"}\"}]",
                    "\"targets\":[]",
                ),
                "no targets",
            ),
            (ok.replace("\"id\":1,", ""), "no integer id"),
        ] {
            let e = dashboard_exprs(&bad).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        let twice = ok.replace("}]}]}", "}]},{\"id\":1,\"type\":\"row\",\"title\":\"r\",\"gridPos\":{\"h\":1,\"w\":24,\"x\":0,\"y\":9}}]}");
        assert!(dashboard_exprs(&twice).unwrap_err().contains("used twice"));
        let over = ok.replace("}]}]}", "}]},{\"id\":2,\"type\":\"row\",\"title\":\"r\",\"gridPos\":{\"h\":1,\"w\":24,\"x\":0,\"y\":3}}]}");
        assert!(dashboard_exprs(&over).unwrap_err().contains("overlaps"));
    }
}
