//! A struct field the derive moves to and from the runtime: what the model reads off
//! a field and the raw syntax tree and the expansion both use.

use proc_macro2::Span;
use syn::Ident;

/// A field the derive moves to and from the runtime.
pub struct TensorField {
    pub ident: Ident,
    /// The feature name (the field's, unless renamed).
    pub feature: String,
    pub optional: bool,
    /// Made by the pipeline when absent (always present in a rank's blocks).
    pub derived: bool,
    pub span: Span,
}
