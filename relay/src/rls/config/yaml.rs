//! A YAML document as a tree of nodes that keep their line and, for
//! scalars, the text as written: envoyproxy/ratelimit reads its files with
//! yaml.v2 (YAML 1.1), which gives a string field a scalar's text whatever
//! it resolves to (`value: 0123` is "0123") and reads `yes`/`no`/`on`/`off`
//! as booleans. Parsed with yaml-rust2's event parser; the scalars are
//! resolved here, as yaml.v2 resolves them.
//!
//! A config is bounded as its events arrive, before anything past a bound
//! is built: aliases copy what their anchor names, so ten levels of ten
//! aliases would expand to 10^10 nodes (yaml.v2 refuses such "excessive
//! aliasing" too), and a deep nesting would overflow the stack of every
//! step that walks the tree. The bounds on what is built hold for all the
//! files of a config together ([`Spent`]): a thousand files, each within
//! them, would otherwise build a thousand times as much.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// Collections nested in one another (a config file needs under ten).
pub const MAX_DEPTH: usize = 64;
/// Aliases (`*name`) of a config.
pub const MAX_ALIASES: usize = 100_000;
/// Nodes built for a config, each copy an anchor or an alias makes counted.
pub const MAX_NODES: usize = 1_000_000;
/// Bytes of scalar text built for a config, copies counted.
pub const MAX_TEXT_BYTES: usize = 16 << 20;

/// What the files of a config read so far have built, copies included.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spent {
    nodes: usize,
    text: usize,
    aliases: usize,
}

/// A node and the line it starts on (1-based).
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub value: Value,
    pub line: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A scalar: its text and what it resolves to.
    Scalar(String, Scalar),
    Seq(Vec<Node>),
    /// Entries in document order.
    Map(Vec<(Node, Node)>),
}

/// What a scalar resolves to (YAML 1.1, as yaml.v2).
#[derive(Clone, Debug, PartialEq)]
pub enum Scalar {
    Null,
    Bool(bool),
    Int(i64),
    /// A float, or an integer too large for an i64.
    Float,
    Str,
}

impl Node {
    /// The YAML tag name of the node, as yaml.v2 names it in its errors.
    pub fn tag(&self) -> &'static str {
        match &self.value {
            Value::Scalar(_, Scalar::Null) => "!!null",
            Value::Scalar(_, Scalar::Bool(_)) => "!!bool",
            Value::Scalar(_, Scalar::Int(_)) => "!!int",
            Value::Scalar(_, Scalar::Float) => "!!float",
            Value::Scalar(_, Scalar::Str) => "!!str",
            Value::Seq(_) => "!!seq",
            Value::Map(_) => "!!map",
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self.value, Value::Scalar(_, Scalar::Null))
    }

    /// A short text of the node for a message: a scalar's text (cut), or
    /// its kind.
    pub fn shown(&self) -> String {
        match &self.value {
            Value::Scalar(text, _) => super::cut(text),
            Value::Seq(_) => "a list".into(),
            Value::Map(_) => "a map".into(),
        }
    }
}

/// Parses `text` alone: see [`parse_within`].
pub fn parse(text: &str) -> Result<Node, String> {
    parse_within(text, &mut Spent::default())
}

/// Parses `text`: one document (an empty file is an empty map), within
/// what the config's other files left of the bounds (`spent`, updated).
/// The error names the line, and the bound a hostile file crossed. Events
/// are pulled one at a time (yaml-rust2's `load` recurses once a level),
/// and the first refusal stops the parse.
pub fn parse_within(text: &str, spent: &mut Spent) -> Result<Node, String> {
    let mut builder = Builder { built: *spent, ..Builder::default() };
    let mut parser = Parser::new_from_str(text);
    loop {
        let (event, mark) = parser.next_token().map_err(|e| format!("line {}: {}", e.marker().line(), e.info()))?;
        if event == Event::StreamEnd {
            break;
        }
        builder.on_event(event, mark);
        if let Some(e) = builder.error.take() {
            return Err(e);
        }
    }
    *spent = builder.built;
    match builder.documents.len() {
        0 => Ok(Node { value: Value::Map(Vec::new()), line: 1 }),
        1 => Ok(builder.documents.remove(0)),
        _ => {
            Err(format!("line {}: a second YAML document ('---'): a config file holds one", builder.documents[1].line))
        }
    }
}

/// What a node costs: the nodes and the bytes of text in it.
#[derive(Clone, Copy, Default)]
struct Size {
    nodes: usize,
    text: usize,
}

/// Builds nodes from the parser's events, within the bounds.
#[derive(Default)]
struct Builder {
    documents: Vec<Node>,
    /// Open collections: the node, for a map a key waiting for its value,
    /// and what had been built when it opened.
    stack: Vec<(Node, Option<Node>, Spent)>,
    /// Each anchor's node and its size.
    anchors: HashMap<usize, (Node, Size)>,
    /// Anchors of the open collections.
    anchor_stack: Vec<usize>,
    /// Built so far for the config, this file's copies included.
    built: Spent,
    error: Option<String>,
}

impl Builder {
    /// Counts `size` more built; false (and the error set) past a bound.
    fn grow(&mut self, size: Size, line: usize) -> bool {
        self.built.nodes += size.nodes;
        self.built.text += size.text;
        let crossed = if self.built.nodes > MAX_NODES {
            format!("more than {MAX_NODES} nodes")
        } else if self.built.text > MAX_TEXT_BYTES {
            format!("more than {MAX_TEXT_BYTES} bytes of text")
        } else {
            return true;
        };
        self.error = Some(format!(
            "line {line}: {crossed} with aliases expanded, the bound on a config (its files together; excessive \
             aliasing?)"
        ));
        false
    }

    /// Places a finished node; an anchored one is also kept, a copy that
    /// counts as much again.
    fn push(&mut self, node: Node, anchor: usize, size: Size) {
        if anchor > 0 {
            if !self.grow(size, node.line) {
                return;
            }
            self.anchors.insert(anchor, (node.clone(), size));
        }
        let Some((parent, pending, _)) = self.stack.last_mut() else {
            self.documents.push(node);
            return;
        };
        match &mut parent.value {
            Value::Seq(items) => items.push(node),
            Value::Map(entries) => match pending.take() {
                None => *pending = Some(node),
                Some(key) => entries.push((key, node)),
            },
            Value::Scalar(..) => {}
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, event: Event, mark: Marker) {
        let line = mark.line();
        if self.error.is_some() {
            return;
        }
        match event {
            Event::Scalar(text, style, anchor, tag) => {
                let size = Size { nodes: 1, text: text.len() };
                if !self.grow(size, line) {
                    return;
                }
                let plain = style == TScalarStyle::Plain;
                let string_tag = tag.as_ref().is_some_and(|t| t.handle == "!!" && t.suffix == "str")
                    || tag.as_ref().is_some_and(|t| t.handle == "tag:yaml.org,2002:" && t.suffix == "str");
                let scalar = if plain && !string_tag { resolve(&text) } else { Scalar::Str };
                self.push(Node { value: Value::Scalar(text, scalar), line }, anchor, size);
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if self.stack.len() == MAX_DEPTH {
                    self.error =
                        Some(format!("line {line}: nested deeper than {MAX_DEPTH} levels, the bound on a config file"));
                    return;
                }
                let opened = self.built;
                if !self.grow(Size { nodes: 1, text: 0 }, line) {
                    return;
                }
                let value = match event {
                    Event::SequenceStart(..) => Value::Seq(Vec::new()),
                    _ => Value::Map(Vec::new()),
                };
                self.stack.push((Node { value, line }, None, opened));
                self.anchor_stack.push(anchor);
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let (Some((node, _, opened)), Some(anchor)) = (self.stack.pop(), self.anchor_stack.pop()) {
                    let size = Size { nodes: self.built.nodes - opened.nodes, text: self.built.text - opened.text };
                    self.push(node, anchor, size);
                }
            }
            Event::Alias(id) => {
                self.built.aliases += 1;
                if self.built.aliases > MAX_ALIASES {
                    self.error = Some(format!(
                        "line {line}: more than {MAX_ALIASES} aliases, the bound on a config (its files together)"
                    ));
                    return;
                }
                let Some(size) = self.anchors.get(&id).map(|(_, size)| *size) else {
                    self.error = Some(format!("line {line}: an alias names no anchor"));
                    return;
                };
                // Counted before it is copied.
                if self.grow(size, line) {
                    let node = self.anchors[&id].0.clone();
                    self.push(node, 0, size);
                }
            }
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentStart | Event::DocumentEnd => {}
        }
    }
}

/// A plain scalar resolved as yaml.v2 resolves it.
fn resolve(text: &str) -> Scalar {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Scalar::Null,
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => return Scalar::Bool(true),
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Scalar::Bool(false)
        }
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" | "-.inf" | "-.Inf" | "-.INF" | ".nan" | ".NaN"
        | ".NAN" => return Scalar::Float,
        _ => {}
    }
    let first = text.as_bytes()[0];
    if !(first.is_ascii_digit() || matches!(first, b'-' | b'+' | b'.')) {
        return Scalar::Str;
    }
    let plain = text.replace('_', "");
    if let Some(n) = int(&plain) {
        return match i64::try_from(n) {
            Ok(n) => Scalar::Int(n),
            Err(_) => Scalar::Float,
        };
    }
    if plain.parse::<f64>().is_ok() && plain.bytes().any(|b| b.is_ascii_digit()) {
        return Scalar::Float;
    }
    Scalar::Str
}

/// An integer as Go's strconv.ParseInt(s, 0, 64) reads it (sign, then
/// 0x, 0o, 0b or a leading 0 for octal), widened so that a value past an
/// i64 can be told apart from text.
fn int(text: &str) -> Option<i128> {
    let (negative, digits) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let lower = digits.to_ascii_lowercase();
    let (radix, body) = if let Some(hex) = lower.strip_prefix("0x") {
        (16, hex)
    } else if let Some(octal) = lower.strip_prefix("0o") {
        (8, octal)
    } else if let Some(binary) = lower.strip_prefix("0b") {
        (2, binary)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, lower.as_str())
    };
    if body.is_empty() || !body.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = u128::from_str_radix(body, radix).ok()?.min(u128::from(u64::MAX) * 4);
    let n = magnitude as i128;
    Some(if negative { -n } else { n })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(text: &str) -> Scalar {
        match parse(&format!("k: {text}\n")).unwrap().value {
            Value::Map(entries) => match &entries[0].1.value {
                Value::Scalar(_, s) => s.clone(),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn scalars_resolve_as_yaml_1_1() {
        assert_eq!(scalar("yes"), Scalar::Bool(true));
        assert_eq!(scalar("Off"), Scalar::Bool(false));
        assert_eq!(scalar("'yes'"), Scalar::Str);
        assert_eq!(scalar("~"), Scalar::Null);
        assert_eq!(scalar(""), Scalar::Null);
        assert_eq!(scalar("12"), Scalar::Int(12));
        assert_eq!(scalar("-1"), Scalar::Int(-1));
        assert_eq!(scalar("0x1F"), Scalar::Int(31));
        assert_eq!(scalar("010"), Scalar::Int(8));
        assert_eq!(scalar("1_000"), Scalar::Int(1000));
        assert_eq!(scalar("1.5"), Scalar::Float);
        assert_eq!(scalar("1e3"), Scalar::Float);
        assert_eq!(scalar(".inf"), Scalar::Float);
        assert_eq!(scalar("99999999999999999999"), Scalar::Float);
        assert_eq!(scalar("abc"), Scalar::Str);
        assert_eq!(scalar("1.2.3.4"), Scalar::Str);
        assert_eq!(scalar("!!str 12"), Scalar::Str);
        assert_eq!(scalar("\"12\""), Scalar::Str);
    }

    #[test]
    fn text_and_lines_are_kept() {
        let doc = parse("a: 1\nb:\n  - x: 0123\n").unwrap();
        let Value::Map(entries) = doc.value else { panic!() };
        assert_eq!(entries[1].0.line, 2);
        let Value::Seq(items) = &entries[1].1.value else { panic!() };
        let Value::Map(inner) = &items[0].value else { panic!() };
        assert_eq!(inner[0].1.value, Value::Scalar("0123".into(), Scalar::Int(83)));
        assert_eq!(inner[0].1.line, 3);
    }

    #[test]
    fn empty_documents_anchors_and_errors() {
        assert_eq!(parse("").unwrap().value, Value::Map(Vec::new()));
        assert_eq!(parse("# only a comment\n").unwrap().value, Value::Map(Vec::new()));
        let doc = parse("a: &x {k: v}\nb: *x\n").unwrap();
        let Value::Map(entries) = doc.value else { panic!() };
        assert_eq!(entries[0].1.value, entries[1].1.value);
        assert!(parse("'''\n").unwrap_err().starts_with("line "), "{:?}", parse("'''\n"));
        assert!(parse("a: 1\n---\nb: 2\n").unwrap_err().contains("second YAML document"));
    }

    #[test]
    fn bounds_are_exact() {
        let nested = |depth: usize| format!("{}x{}", "[".repeat(depth), "]".repeat(depth));
        assert!(parse(&nested(MAX_DEPTH)).is_ok());
        assert_eq!(
            parse(&nested(MAX_DEPTH + 1)).unwrap_err(),
            "line 1: nested deeper than 64 levels, the bound on a config file"
        );
        // A list of n aliases of an anchored list of 9 scalars: the anchor's
        // 10 nodes, their copy, the outer list, then 10 an alias.
        let aliased = |n: usize| format!("[&a [{}], {}]", ["x"; 9].join(","), vec!["*a"; n].join(","));
        let fits = (MAX_NODES - 21) / 10;
        assert!(parse(&aliased(fits)).is_ok());
        assert!(parse(&aliased(fits + 1)).unwrap_err().contains("more than 1000000 nodes"));
    }
}
