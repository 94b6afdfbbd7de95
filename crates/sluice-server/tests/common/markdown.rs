//! The commands a document tells its reader to run: its fenced `sh` and
//! `console` blocks, split into commands (with what a `console` block shows
//! each one printing), and the programs those commands start.

use std::path::{Path, PathBuf};

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The text of `path`, relative to the repository's root.
pub fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A fenced block: its info string (`sh`, `console`, `yaml`, …), the last
/// heading above it, the line its fence opens on, and its text.
#[derive(Debug, Clone)]
pub struct Block {
    pub info: String,
    pub heading: String,
    pub line: usize,
    pub text: String,
}

impl Block {
    /// Whether the block holds commands to run (`sh` or `console`).
    pub fn is_commands(&self) -> bool {
        matches!(self.info.as_str(), "sh" | "console")
    }
}

/// One command and the lines a `console` block shows it printing.
#[derive(Debug, Clone)]
pub struct Step {
    pub command: String,
    pub shown: Vec<String>,
}

/// Every fenced block of `markdown`, in order.
pub fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut heading = String::new();
    let mut open: Option<Block> = None;
    for (number, line) in markdown.lines().enumerate() {
        match open.as_mut() {
            Some(block) if line.trim_start().starts_with("```") => {
                out.push(block.clone());
                open = None;
            }
            Some(block) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            None if line.trim_start().starts_with("```") => {
                let info = line.trim_start().trim_start_matches('`').trim();
                open = Some(Block {
                    info: info.split_whitespace().next().unwrap_or("").to_owned(),
                    heading: heading.clone(),
                    line: number + 1,
                    text: String::new(),
                });
            }
            None if line.starts_with('#') => {
                heading = line.trim_start_matches('#').trim().to_owned();
            }
            None => {}
        }
    }
    out
}

/// The commands of a `sh` or `console` block, a line ending in `\` joined
/// with the next. In a `console` block commands start with `$ ` and the
/// other lines are what the command before them prints.
pub fn steps(block: &Block) -> Vec<Step> {
    let console = block.info == "console";
    let mut out: Vec<Step> = Vec::new();
    let mut continued = false;
    for line in block.text.lines() {
        if continued {
            let step = out.last_mut().unwrap();
            step.command.push('\n');
            step.command.push_str(line);
            continued = line.ends_with('\\');
            continue;
        }
        let command = if console {
            line.strip_prefix("$ ")
        } else {
            Some(line).filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        };
        match command {
            Some(command) => {
                out.push(Step {
                    command: command.to_owned(),
                    shown: Vec::new(),
                });
                continued = command.ends_with('\\');
            }
            None if console && !line.trim().is_empty() => out
                .last_mut()
                .unwrap_or_else(|| panic!("output before any command: {line}"))
                .shown
                .push(line.to_owned()),
            None => {}
        }
    }
    out
}

/// Shell words after which the program comes.
const KEYWORDS: &[&str] = &[
    "do", "then", "else", "if", "while", "until", "!", "export", "time",
];

/// The shell's own commands: they start no program.
const BUILTINS: &[&str] = &[
    "cd", "echo", "printf", "test", "[", "true", "false", "wait", "set", "unset", "exit", "done",
    "fi", "read", "trap", "source", ".",
];

/// The programs `command` starts: the first word of each of its simple
/// commands (after `|`, `&&`, `;`, `&`, `$(`, a shell keyword, and any
/// `NAME=value` before it), builtins left out.
pub fn programs(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    // Quoted text starts nothing: blank it out first.
    let mut bare = String::with_capacity(command.len());
    let mut quote = None;
    for c in command.chars() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, c) => bare.push(c),
        }
    }
    let bare = bare.replace("\\\n", " ");
    for segment in bare.split(['|', '&', ';', '\n', '(', ')', '`']) {
        let mut words = segment
            .split_whitespace()
            .take_while(|w| !w.starts_with('#'))
            .skip_while(|w| KEYWORDS.contains(w) || w.contains('=') && !w.starts_with('-'));
        let Some(first) = words.next() else { continue };
        // `for NAME in …` starts nothing; nor do redirections and numbers.
        if first == "for"
            || BUILTINS.contains(&first)
            || !first.starts_with(|c: char| c.is_ascii_alphabetic() || c == '/' || c == '.')
        {
            continue;
        }
        let name = first.rsplit('/').next().unwrap().to_owned();
        if !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// A line with its clock-dependent figures replaced.
pub fn timeless(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    let marks = [
        "t=",
        "\"reset_after_ms\":",
        "\"retry_after_ms\":",
        "retry-after: ",
        "\"expires_at_ms\":",
    ];
    while !rest.is_empty() {
        if let Some(mark) = marks.iter().find(|m| rest.starts_with(**m)) {
            out.push_str(mark);
            rest = &rest[mark.len()..];
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            if digits > 0 {
                out.push('N');
            }
            rest = &rest[digits..];
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}
