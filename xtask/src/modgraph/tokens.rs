//! Rust code as tokens, each with its line: enough to find paths and
//! match brackets, with comments and literals left out.

/// One token: an identifier, `::` or one punctuation character.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tok {
    pub text: String,
    /// 1-based.
    pub line: usize,
}

impl Tok {
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl PartialEq<str> for Tok {
    fn eq(&self, other: &str) -> bool {
        self.text == other
    }
}

impl PartialEq<&str> for Tok {
    fn eq(&self, other: &&str) -> bool {
        self.text == *other
    }
}

/// Rust code as tokens: identifiers, `::` and single punctuation, with
/// comments, string, byte-string and char literals left out (lifetimes
/// stay out too). Enough to find paths and match brackets.
pub fn tokenize(code: &str) -> Vec<Tok> {
    let c: Vec<char> = code.chars().collect();
    let mut lines = Vec::with_capacity(c.len());
    let mut line = 1;
    for &ch in &c {
        lines.push(line);
        if ch == '\n' {
            line += 1;
        }
    }
    let tok = |text: String, at: usize| Tok {
        text,
        line: lines[at],
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            i = skip_block_comment(&c, i);
        } else if let Some(end) = raw_string_end(&c, i) {
            i = end;
        } else if ch == '"' || (ch == 'b' && next == Some('"')) {
            i = skip_string(&c, if ch == 'b' { i + 1 } else { i });
        } else if ch == '\'' || (ch == 'b' && next == Some('\'')) {
            i = skip_char_or_lifetime(&c, if ch == 'b' { i + 1 } else { i });
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(tok(c[start..i].iter().collect(), start));
        } else if ch == ':' && next == Some(':') {
            out.push(tok("::".into(), i));
            i += 2;
        } else {
            out.push(tok(ch.to_string(), i));
            i += 1;
        }
    }
    out
}

fn skip_block_comment(c: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    i
}

/// The end of a raw string `r"..."`, `r#"..."#`, `br#".."#` at `i`, if one starts there.
fn raw_string_end(c: &[char], i: usize) -> Option<usize> {
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return None;
    }
    let mut j = i;
    if c.get(j) == Some(&'b') {
        j += 1;
    }
    if c.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while c.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < c.len() {
        if c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(j)
}

fn skip_string(c: &[char], mut i: usize) -> usize {
    i += 1;
    while i < c.len() {
        match c[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// A char literal (`'a'`, `'\n'`, `'\u{1F600}'`) is skipped whole; a
/// lifetime or label (`'a`) only its quote.
fn skip_char_or_lifetime(c: &[char], i: usize) -> usize {
    if c.get(i + 1) == Some(&'\\') {
        let mut j = i + 2;
        while j < c.len() && c[j] != '\'' {
            j += 1;
        }
        return j + 1;
    }
    if c.get(i + 2) == Some(&'\'') {
        return i + 3;
    }
    i + 1
}
