//! Source locations carried from the YAML (or a derive attribute) into the IR.

use serde::{Deserialize, Serialize};

/// Where an item of the spec came from: 1-based line and column, and the byte range
/// used to underline it in a rendered diagnostic; or, for an item a front end built from
/// something other than text (a derive attribute), that front end's token for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Loc {
    /// 1-based line; 0 when not from text.
    pub line: u32,
    /// 1-based column, in characters.
    pub column: u32,
    /// Byte offset in the text.
    pub offset: usize,
    /// Bytes to underline.
    pub len: usize,
    /// The front end's token plus one (0: none). The derive numbers its attributes'
    /// spans and maps an error's token back to the span it was written at.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub token: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Loc {
    /// A location that points nowhere (items built in code, not parsed).
    pub const UNKNOWN: Loc = Loc {
        line: 0,
        column: 0,
        offset: 0,
        len: 0,
        token: 0,
    };

    /// The location of a front end's token `id`: no text position, but an error at it
    /// can be taken back to where the front end read it ([`Loc::token_id`]).
    pub const fn at_token(id: u32) -> Loc {
        Loc {
            token: id.saturating_add(1),
            ..Loc::UNKNOWN
        }
    }

    /// The front-end token this location stands for, if it is one.
    pub fn token_id(&self) -> Option<u32> {
        self.token.checked_sub(1)
    }

    /// Whether this is a position in spec text.
    pub fn is_known(&self) -> bool {
        self.line > 0
    }

    pub(crate) fn from_saphyr(loc: &serde_saphyr::Location) -> Loc {
        let span = loc.span();
        Loc {
            line: u32::try_from(loc.line()).unwrap_or(u32::MAX),
            column: u32::try_from(loc.column()).unwrap_or(u32::MAX),
            offset: span
                .byte_offset()
                .and_then(|o| usize::try_from(o).ok())
                .unwrap_or(0),
            len: span
                .byte_len()
                .and_then(|l| usize::try_from(l).ok())
                .unwrap_or(0)
                .max(1),
            token: 0,
        }
    }
}

impl Loc {
    /// This location with its byte offset moved to its line and column in `text`, when
    /// the two disagree (YAML syntax errors come with a line and column but no byte
    /// offset, which would underline the first character instead).
    pub(crate) fn anchored(self, text: &str) -> Loc {
        if !self.is_known() || line_col(text, self.offset) == (self.line, self.column) {
            return self;
        }
        let Some(offset) = offset_of(text, self.line, self.column) else {
            return self;
        };
        Loc {
            offset,
            len: self.len.min(text.len() - offset).max(1),
            ..self
        }
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_col(text: &str, offset: usize) -> (u32, u32) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (
        u32::try_from(line).unwrap_or(u32::MAX),
        u32::try_from(column).unwrap_or(u32::MAX),
    )
}

/// The byte offset of a 1-based line and column, if the text has them.
fn offset_of(text: &str, line: u32, column: u32) -> Option<usize> {
    let start: usize = text
        .split_inclusive('\n')
        .take(usize::try_from(line).ok()?.checked_sub(1)?)
        .map(str::len)
        .sum();
    let rest = text.get(start..)?;
    let col = usize::try_from(column).ok()?.checked_sub(1)?;
    let within = rest.char_indices().nth(col).map(|(i, _)| i);
    within
        .or((col == rest.chars().count()).then_some(rest.len()))
        .map(|i| start + i)
}

impl std::fmt::Display for Loc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_location_without_its_offset_is_anchored_at_its_line_and_column() {
        let text = "a: 1\nbé: [2\n";
        let bare = Loc {
            line: 2,
            column: 4,
            offset: 0,
            len: 1,
            token: 0,
        };
        let at = bare.anchored(text);
        assert_eq!(at.offset, 9);
        assert_eq!(line_col(text, at.offset), (2, 4));
        // A consistent location is left as it is; one past the text is not moved.
        assert_eq!(at.anchored(text), at);
        let past = Loc { line: 9, ..bare };
        assert_eq!(past.anchored(text), past);
    }
}
