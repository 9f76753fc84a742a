//! `#[derive(Features)]`: a feature struct as a featshard spec.
//!
//! A thin shim: the attributes (see [`attr`] for the grammar) become the spec's syntax
//! tree, the one a YAML file parses to ([`raw`]); the spec crate lowers and checks it and
//! infers the plan, and codegen's Rust emitter writes the tables.
//! Or `#[featshard(spec = "path.yaml", workflow = "inference")]` checks the struct
//! against a YAML spec at compile time. Every error of a struct is reported at once,
//! each on the field or attribute it is about.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod attr;
#[cfg(test)]
mod cross_front_end;
mod expand;
mod field;
mod model;
mod raw;

use proc_macro::TokenStream;

/// Derives the placement tables, the embedded plan and the runtime methods of a feature
/// struct; every field a `tch::Tensor` (or `Option` of one) with a `#[featshard(...)]`
/// attribute, or the struct checked against a YAML spec (`spec = "..."`).
#[proc_macro_derive(Features, attributes(featshard))]
pub fn derive_features(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    let mut errors = Vec::new();
    let model = model::model(&input, &mut errors);
    let result = match (model, errors.is_empty()) {
        (Some(m), true) => expand::expand(&input, &m),
        _ => Err(combine(errors)),
    };
    result.unwrap_or_else(syn::Error::into_compile_error).into()
}

fn combine(errors: Vec<syn::Error>) -> syn::Error {
    let mut iter = errors.into_iter();
    let mut first = iter.next().unwrap_or_else(|| {
        syn::Error::new(proc_macro2::Span::call_site(), "invalid featshard struct")
    });
    for e in iter {
        first.combine(e);
    }
    first
}
