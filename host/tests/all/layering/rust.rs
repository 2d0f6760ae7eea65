//! Just enough of Rust's syntax to read a source file's module structure: its tokens
//! (comments and literals set aside), its `mod` declarations, its `use` trees, the paths it
//! names, the items it defines, and which of its lines are test code (`#[cfg(test)]` items).
//! No macro is expanded: a path written inside a macro counts for the file that writes it.

use std::collections::{BTreeMap, BTreeSet};

/// A token, by its text, and the line it starts on (from 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub text: String,
    pub line: usize,
    pub kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Ident,
    /// `::`, or any other single character of punctuation.
    Punct,
    /// A string literal: its text between the quotes (escapes left as written).
    Str,
    /// A number, character, byte or lifetime.
    Other,
}

/// A file split into tokens, with the lines that hold only comments.
pub struct Lexed {
    pub tokens: Vec<Token>,
    pub comment_lines: BTreeSet<usize>,
    pub lines: usize,
}

pub fn lex(text: &str) -> Lexed {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut commented = BTreeSet::new();
    let mut coded = BTreeSet::new();
    let (mut at, mut line) = (0, 1);
    let peek = |at: usize| chars.get(at).copied().unwrap_or('\0');
    while at < chars.len() {
        let c = chars[at];
        let start = line;
        if c == '\n' {
            line += 1;
            at += 1;
        } else if c.is_whitespace() {
            at += 1;
        } else if c == '/' && peek(at + 1) == '/' {
            while at < chars.len() && chars[at] != '\n' {
                at += 1;
            }
            commented.insert(start);
        } else if c == '/' && peek(at + 1) == '*' {
            let mut depth = 0;
            loop {
                if at >= chars.len() {
                    break;
                }
                if chars[at] == '/' && peek(at + 1) == '*' {
                    depth += 1;
                    at += 2;
                } else if chars[at] == '*' && peek(at + 1) == '/' {
                    depth -= 1;
                    at += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[at] == '\n' {
                        line += 1;
                    }
                    at += 1;
                }
            }
            commented.extend(start..=line);
        } else if let Some((end, lines, content)) = string_at(&chars, at) {
            tokens.push(Token { text: content, line, kind: Kind::Str });
            coded.extend(line..=line + lines);
            line += lines;
            at = end;
        } else if c == '\'' {
            // A character literal ('a', '\n', '\u{..}') or a lifetime or label ('a).
            let end = if peek(at + 1) == '\\' {
                // Past the escaped character: `'\''` is one literal.
                let mut end = at + 3;
                while end < chars.len() && chars[end] != '\'' {
                    end += 1;
                }
                end + 1
            } else if peek(at + 2) == '\'' {
                at + 3
            } else {
                let mut end = at + 1;
                while end < chars.len() && (chars[end].is_alphanumeric() || chars[end] == '_') {
                    end += 1;
                }
                end
            };
            tokens.push(Token { text: chars[at..end].iter().collect(), line, kind: Kind::Other });
            coded.insert(line);
            at = end;
        } else if c.is_alphabetic() || c == '_' {
            let mut end = at;
            while end < chars.len() && (chars[end].is_alphanumeric() || chars[end] == '_') {
                end += 1;
            }
            let mut text: String = chars[at..end].iter().collect();
            // A raw identifier, `r#type`, is the identifier.
            if text == "r" && peek(end) == '#' && (peek(end + 1).is_alphabetic() || peek(end + 1) == '_') {
                let from = end + 1;
                end = from;
                while end < chars.len() && (chars[end].is_alphanumeric() || chars[end] == '_') {
                    end += 1;
                }
                text = chars[from..end].iter().collect();
            }
            tokens.push(Token { text, line, kind: Kind::Ident });
            coded.insert(line);
            at = end;
        } else if c.is_ascii_digit() {
            let mut end = at;
            while end < chars.len() && (chars[end].is_alphanumeric() || chars[end] == '_') {
                end += 1;
            }
            tokens.push(Token { text: chars[at..end].iter().collect(), line, kind: Kind::Other });
            coded.insert(line);
            at = end;
        } else if c == ':' && peek(at + 1) == ':' {
            tokens.push(Token { text: "::".to_owned(), line, kind: Kind::Punct });
            coded.insert(line);
            at += 2;
        } else {
            tokens.push(Token { text: c.to_string(), line, kind: Kind::Punct });
            coded.insert(line);
            at += 1;
        }
    }
    let comment_lines = commented.difference(&coded).copied().collect();
    Lexed { tokens, comment_lines, lines: text.lines().count() }
}

/// A string literal starting at `at` ("…", r"…", r#"…"#, b"…", br"…", c"…"): where it ends,
/// how many line breaks it holds, and its text.
fn string_at(chars: &[char], at: usize) -> Option<(usize, usize, String)> {
    let mut i = at;
    while i < chars.len() && i - at < 2 && matches!(chars[i], 'b' | 'c' | 'r') {
        i += 1;
    }
    if i > at && (chars[at..i].iter().filter(|&&c| c == 'r').count() > 1) {
        return None;
    }
    let raw = chars[at..i].contains(&'r');
    // A prefix only makes a literal when a quote (or, raw, `#`s and a quote) follows; else it
    // starts an identifier.
    let mut hashes = 0;
    if raw {
        while chars.get(i + hashes) == Some(&'#') {
            hashes += 1;
        }
    }
    if chars.get(i + hashes) != Some(&'"') {
        return None;
    }
    if i > at && at > 0 && (chars[at - 1].is_alphanumeric() || chars[at - 1] == '_') {
        return None;
    }
    let from = i + hashes + 1;
    let mut end = from;
    let mut lines = 0;
    loop {
        let c = *chars.get(end)?;
        if c == '\n' {
            lines += 1;
        }
        if !raw && c == '\\' {
            if chars.get(end + 1) == Some(&'\n') {
                lines += 1;
            }
            end += 2;
            continue;
        }
        if c == '"' && (0..hashes).all(|k| chars.get(end + 1 + k) == Some(&'#')) {
            let content = chars[from..end].iter().collect();
            return Some((end + 1 + hashes, lines, content));
        }
        end += 1;
    }
}

/// A path as written: its segments (`crate`, `super`, `self` kept), and where.
#[derive(Debug, Clone)]
pub struct Written {
    /// The module (file or inline) it is written in, from the file's module.
    pub inline: Vec<String>,
    pub segments: Vec<String>,
    pub line: usize,
}

/// A name a `use` brings in: `use a::b as c;` binds `c` to `a::b`; a glob binds nothing.
#[derive(Debug, Clone)]
pub struct Import {
    pub path: Written,
    /// `None` for a glob (`a::*`) or `as _`.
    pub binding: Option<String>,
}

/// `mod name;`: a module in a file of its own.
#[derive(Debug, Clone)]
pub struct Declared {
    pub inline: Vec<String>,
    pub name: String,
    /// `#[path = "…"]`.
    pub path: Option<String>,
    /// Declared under `#[cfg(test)]`.
    pub test: bool,
}

/// What a file says about modules.
#[derive(Debug, Default)]
pub struct Parsed {
    pub declared: Vec<Declared>,
    /// Inline modules (`mod name { … }`), by their path within the file.
    pub inline: BTreeSet<Vec<String>>,
    pub imports: Vec<Import>,
    /// Paths named outside `use`, that start from `crate`, `super`, `self` or a name.
    pub paths: Vec<Written>,
    /// Names each module of the file (by its inline path) defines: functions, types,
    /// constants, macros, modules.
    pub defined: BTreeMap<Vec<String>, BTreeSet<String>>,
    /// Lines of `#[cfg(test)]` items.
    pub test_lines: BTreeSet<usize>,
}

const ITEMS: &[&str] = &["fn", "struct", "enum", "trait", "type", "const", "static", "union"];
const KEYWORDS: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "dyn", "else", "enum", "extern", "fn", "for", "if", "impl",
    "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return", "static", "struct", "trait", "type",
    "unsafe", "use", "where", "while", "Self",
];

pub fn parse(tokens: &[Token]) -> Parsed {
    let mut parsed = Parsed::default();
    // Inline modules open around the current token: (brace depth inside it, name).
    let mut inline: Vec<(usize, String)> = Vec::new();
    let mut depth = 0;
    let (mut test, mut path_attr): (Option<usize>, Option<String>) = (None, None);
    let mut at = 0;
    let text = |at: usize| tokens.get(at).map_or("", |t| t.text.as_str());
    while at < tokens.len() {
        let token = &tokens[at];
        let here: Vec<String> = inline.iter().map(|(_, name)| name.clone()).collect();
        let module_depth = inline.last().map_or(0, |(inside, _)| *inside);
        // Attributes: `#[cfg(test)]` marks the next item as test code; `#[path = "…"]`
        // places the next `mod`.
        if token.text == "#" && (text(at + 1) == "[" || (text(at + 1) == "!" && text(at + 2) == "[")) {
            let open = if text(at + 1) == "[" { at + 1 } else { at + 2 };
            let close = matching(tokens, open);
            let inside: Vec<&str> = tokens[open + 1..close].iter().map(|t| t.text.as_str()).collect();
            if inside == ["cfg", "(", "test", ")"] {
                test = Some(token.line);
            } else if inside.len() == 3 && inside[0] == "path" && inside[1] == "=" {
                path_attr = Some(tokens[open + 3].text.clone());
            }
            at = close + 1;
            continue;
        }
        if let Some(from) = test.take() {
            let end = item_end(tokens, at);
            let is_mod = item_keyword(tokens, at) == "mod";
            if is_mod && text(end) == ";" {
                let name = tokens[at..end].iter().rev().find(|t| t.kind == Kind::Ident).map(|t| t.text.clone());
                if let Some(name) = name {
                    parsed.declared.push(Declared { inline: here.clone(), name, path: path_attr.take(), test: true });
                }
            }
            let last = tokens.get(end).map_or(token.line, |t| t.line);
            parsed.test_lines.extend(from..=last);
            path_attr = None;
            at = end + 1;
            continue;
        }
        match token.text.as_str() {
            "use" if token.kind == Kind::Ident && text(at + 1) != "<" => {
                let end = item_end(tokens, at);
                use_tree(&tokens[at + 1..end], &here, &mut Vec::new(), &mut parsed.imports);
                at = end + 1;
                continue;
            }
            "mod" if tokens.get(at + 1).is_some_and(|t| t.kind == Kind::Ident) && depth == module_depth => {
                let name = tokens[at + 1].text.clone();
                parsed.defined.entry(here.clone()).or_default().insert(name.clone());
                if text(at + 2) == ";" {
                    parsed.declared.push(Declared { inline: here, name, path: path_attr.take(), test: false });
                    at += 3;
                    continue;
                }
                if text(at + 2) == "{" {
                    depth += 1;
                    inline.push((depth, name.clone()));
                    let mut module = here;
                    module.push(name);
                    parsed.inline.insert(module);
                    at += 3;
                    continue;
                }
            }
            "macro_rules" if text(at + 1) == "!" && depth == module_depth => {
                parsed.defined.entry(here.clone()).or_default().insert(text(at + 2).to_owned());
            }
            word if ITEMS.contains(&word) && token.kind == Kind::Ident && depth == module_depth => {
                if let Some(name) = tokens.get(at + 1).filter(|t| t.kind == Kind::Ident && t.text != "fn") {
                    parsed.defined.entry(here.clone()).or_default().insert(name.text.clone());
                }
            }
            "{" => depth += 1,
            "}" => {
                if inline.last().is_some_and(|(inside, _)| *inside == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        if matches!(token.text.as_str(), ";" | "{" | "}") {
            path_attr = None;
        }
        // A path: `crate::…`, `$crate::…`, `super::…`, `self::…`, or `name::…`.
        let starts = token.kind == Kind::Ident
            && text(at + 1) == "::"
            && (at == 0 || text(at - 1) != "::")
            && (matches!(token.text.as_str(), "crate" | "super" | "self") || !KEYWORDS.contains(&token.text.as_str()));
        if starts {
            let mut segments = vec![token.text.clone()];
            let mut next = at + 1;
            while text(next) == "::" && tokens.get(next + 1).is_some_and(|t| t.kind == Kind::Ident) {
                segments.push(tokens[next + 1].text.clone());
                next += 2;
            }
            parsed.paths.push(Written { inline: here, segments, line: token.line });
            at = next;
            continue;
        }
        at += 1;
    }
    parsed
}

/// The index of the bracket closing the one at `open`.
fn matching(tokens: &[Token], open: usize) -> usize {
    let mut depth = 0;
    for (at, token) in tokens.iter().enumerate().skip(open) {
        match token.text.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => {
                depth -= 1;
                if depth == 0 {
                    return at;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

/// Where the item (or statement, field, arm) starting at `from` ends: its `;` or its
/// closing brace, or just before the `,` or bracket that ends it.
fn item_end(tokens: &[Token], from: usize) -> usize {
    // An item (`impl<A, B> … where A: X, { … }`) holds commas of its own at its level;
    // a field or an arm ends at one.
    let item = ITEMS.contains(&item_keyword(tokens, from))
        || ["impl", "mod", "use", "trait", "macro_rules", "extern"].contains(&item_keyword(tokens, from));
    let mut depth = 0usize;
    for (at, token) in tokens.iter().enumerate().skip(from) {
        match token.text.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => {
                if depth == 0 {
                    return at.saturating_sub(1);
                }
                depth -= 1;
                if depth == 0 && token.text == "}" {
                    // `struct S { … }` ends here; `S { … }.x` or `{ … };` would go on, but
                    // an attributed item is one or the other and ends at its block.
                    return if tokens.get(at + 1).is_some_and(|t| t.text == ";") { at + 1 } else { at };
                }
            }
            ";" if depth == 0 => return at,
            "," if depth == 0 && !item => return at,
            _ => {}
        }
    }
    tokens.len()
}

/// The keyword of the item starting at `from`, past `pub(…)`, `async`, `unsafe` and the like.
fn item_keyword(tokens: &[Token], from: usize) -> &str {
    let mut at = from;
    while let Some(token) = tokens.get(at) {
        match token.text.as_str() {
            "pub" if tokens.get(at + 1).is_some_and(|t| t.text == "(") => at = matching(tokens, at + 1) + 1,
            "pub" | "async" | "unsafe" | "default" => at += 1,
            // `extern "C" fn`, `const fn`: the keyword after.
            "extern" | "const" if tokens.get(at + 1).is_some_and(|t| t.kind == Kind::Str || t.text == "fn") => {
                at += 1;
            }
            _ if token.kind == Kind::Str => at += 1,
            word => return word,
        }
    }
    ""
}

/// Reads a `use` tree (without `use` and `;`), adding what it imports.
fn use_tree(tokens: &[Token], inline: &[String], prefix: &mut Vec<String>, out: &mut Vec<Import>) {
    let mut at = 0;
    let start = prefix.len();
    let line = tokens.first().map_or(0, |t| t.line);
    let text = |at: usize| tokens.get(at).map_or("", |t| t.text.as_str());
    if text(0) == "::" {
        // `::name`: a crate, never this one's module.
        return;
    }
    if text(0) == "$" {
        at += 1;
    }
    loop {
        match text(at) {
            "{" => {
                let close = matching(tokens, at);
                let mut from = at + 1;
                let mut level = 0;
                for i in at + 1..=close.min(tokens.len()) {
                    let t = text(i);
                    if matches!(t, "{" | "(" | "[") {
                        level += 1;
                    } else if matches!(t, "}" | ")" | "]") && level > 0 {
                        level -= 1;
                    } else if (t == "," && level == 0) || i == close {
                        if from < i {
                            use_tree(&tokens[from..i], inline, prefix, out);
                        }
                        from = i + 1;
                    }
                }
                break;
            }
            "*" => {
                let path = Written { inline: inline.to_vec(), segments: prefix.clone(), line };
                out.push(Import { path, binding: None });
                break;
            }
            "" => break,
            segment => {
                prefix.push(segment.to_owned());
                if text(at + 1) == "::" {
                    at += 2;
                    continue;
                }
                let binding = if text(at + 1) == "as" {
                    Some(text(at + 2).to_owned()).filter(|name| name != "_")
                } else if segment == "self" {
                    prefix.pop();
                    prefix.last().cloned()
                } else {
                    Some(segment.to_owned())
                };
                let path = Written { inline: inline.to_vec(), segments: prefix.clone(), line };
                out.push(Import { path, binding });
                break;
            }
        }
    }
    prefix.truncate(start);
}
