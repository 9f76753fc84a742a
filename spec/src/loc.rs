//! Source locations carried from the YAML (or a derive attribute) into the IR.

use serde::{Deserialize, Serialize};

/// Where an item of the spec came from: 1-based line and column, and the byte range
/// used to underline it in a rendered diagnostic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Loc {
    pub line: u32,
    pub column: u32,
    pub offset: usize,
    pub len: usize,
}

impl Loc {
    /// A location that points nowhere (items built in code, not parsed).
    pub const UNKNOWN: Loc = Loc {
        line: 0,
        column: 0,
        offset: 0,
        len: 0,
    };

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
        }
    }
}

impl std::fmt::Display for Loc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}
