//! Spec errors: values collected and reported together, each naming the feature, the
//! axis and the source location it is about.

use std::fmt;
use std::sync::Arc;

use miette::{Diagnostic, LabeledSpan, SourceCode};

use crate::loc::Loc;

/// One problem in a spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecError {
    /// What is wrong, in one sentence.
    pub message: String,
    /// The feature it is about, if any.
    pub feature: Option<String>,
    /// The axis of that feature it is about, if any.
    pub axis: Option<AxisRef>,
    /// The semantic it is about, if any.
    pub semantic: Option<String>,
    /// Where it was written.
    pub loc: Loc,
    /// How to fix it, when there is one obvious way.
    pub help: Option<String>,
}

/// An axis of a feature: its position and what it counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AxisRef {
    /// The axis position in the feature.
    pub index: usize,
    /// What the axis counts (a semantic or a channel size).
    pub name: String,
}

impl SpecError {
    /// An error at a location, about nothing named yet.
    pub fn new(message: impl Into<String>, loc: Loc) -> Self {
        SpecError {
            message: message.into(),
            feature: None,
            axis: None,
            semantic: None,
            loc,
            help: None,
        }
    }

    /// Names the feature the error is about.
    pub fn feature(mut self, name: &str) -> Self {
        self.feature = Some(name.to_owned());
        self
    }

    /// Names the axis (position and what it counts) the error is about.
    pub fn axis(mut self, index: usize, name: impl fmt::Display) -> Self {
        self.axis = Some(AxisRef {
            index,
            name: name.to_string(),
        });
        self
    }

    /// Names the semantic the error is about.
    pub fn semantic(mut self, name: &str) -> Self {
        self.semantic = Some(name.to_owned());
        self
    }

    /// Adds a hint on how to fix it.
    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// `feature `x`, axis 1 (tokens): ` or `semantic `atoms`: `, the subject of the message.
    fn subject(&self) -> String {
        let mut parts = Vec::new();
        if let Some(f) = &self.feature {
            parts.push(format!("feature `{f}`"));
        }
        if let Some(a) = &self.axis {
            parts.push(format!("axis {} ({})", a.index, a.name));
        }
        if let Some(s) = &self.semantic {
            parts.push(format!("semantic `{s}`"));
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!("{}: ", parts.join(", "))
        }
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.subject(), self.message)
    }
}

impl std::error::Error for SpecError {}

impl Diagnostic for SpecError {
    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        if !self.loc.is_known() {
            return None;
        }
        // A span longer than a snippet is shown by its start.
        let len = self.loc.len.min(SNIPPET);
        let label = LabeledSpan::new_with_span(Some("here".into()), (self.loc.offset, len));
        Some(Box::new(std::iter::once(label)))
    }
}

/// Every error found in one spec, with the source they point into.
#[derive(Clone, Debug)]
pub struct Diagnostics {
    /// What errors call the source (a file name).
    pub source_name: String,
    source: Arc<String>,
    /// Every error, each with its location.
    pub errors: Vec<SpecError>,
}

impl Diagnostics {
    /// Errors of `source`, their locations anchored to its text.
    pub fn new(source_name: &str, source: &str, mut errors: Vec<SpecError>) -> Self {
        for e in &mut errors {
            e.loc = e.loc.anchored(source);
        }
        Diagnostics {
            source_name: source_name.to_owned(),
            source: Arc::new(source.to_owned()),
            errors,
        }
    }

    /// One line per error: `file:line:col: feature `x`, axis 1 (tokens): message`.
    pub fn render_plain(&self) -> String {
        let mut out = String::new();
        for e in &self.errors {
            if e.loc.is_known() {
                out.push_str(&format!("{}:{}: ", self.source_name, e.loc));
            } else {
                out.push_str(&format!("{}: ", self.source_name));
            }
            out.push_str(&e.to_string());
            if let Some(h) = &e.help {
                out.push_str(&format!(" (help: {h})"));
            }
            out.push('\n');
        }
        out
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.errors.as_slice() {
            [one] if one.loc.is_known() => {
                write!(f, "{}:{}: {one}", self.source_name, one.loc)
            }
            [one] => write!(f, "{}: {one}", self.source_name),
            many => write!(f, "{}: {} errors in the spec", self.source_name, many.len()),
        }
    }
}

impl std::error::Error for Diagnostics {}

impl Diagnostic for Diagnostics {
    fn source_code(&self) -> Option<&dyn SourceCode> {
        Some(self as &dyn SourceCode)
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        match self.errors.as_slice() {
            [one] => one
                .help
                .as_ref()
                .map(|h| Box::new(h) as Box<dyn fmt::Display>),
            _ => None,
        }
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        match self.errors.as_slice() {
            [one] => one.labels(),
            _ => None,
        }
    }

    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn Diagnostic> + 'a>> {
        if self.errors.len() < 2 {
            return None;
        }
        Some(Box::new(self.errors.iter().map(|e| e as &dyn Diagnostic)))
    }
}

impl SourceCode for Diagnostics {
    fn read_span<'a>(
        &'a self,
        span: &miette::SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn miette::SpanContents<'a> + 'a>, miette::MietteError> {
        let contents =
            self.source
                .as_str()
                .read_span(span, context_lines_before, context_lines_after)?;
        let (data, at) = (contents.data(), contents.span().offset());
        if data.len() <= 4 * SNIPPET {
            return Ok(Box::new(miette::MietteSpanContents::new_named(
                self.source_name.clone(),
                data,
                *contents.span(),
                contents.line(),
                contents.column(),
                contents.line_count(),
            )));
        }
        // A long line (a spec written on one line, a huge flow mapping) is shown as
        // the snippet around the error, never whole.
        let text = std::str::from_utf8(data).map_err(|_| miette::MietteError::OutOfBounds)?;
        let start = span.offset().saturating_sub(at).min(text.len());
        let from = floor_boundary(text, start.saturating_sub(SNIPPET));
        let to = floor_boundary(text, (start + 2 * SNIPPET).min(text.len()));
        let before = &text[..from];
        let line = contents.line() + before.matches('\n').count();
        let column = from - before.rfind('\n').map_or(0, |n| n + 1);
        let window = &text[from..to];
        Ok(Box::new(miette::MietteSpanContents::new_named(
            self.source_name.clone(),
            window.as_bytes(),
            miette::SourceSpan::new((at + from).into(), window.len()),
            line,
            column,
            window.matches('\n').count() + 1,
        )))
    }
}

/// Bytes of source shown on each side of an error (and of an error's span).
const SNIPPET: usize = 160;

/// The largest char boundary of `s` at or before `i`.
fn floor_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}
