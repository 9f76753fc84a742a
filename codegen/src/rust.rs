//! The Rust placement module: typed tables built with quote, formatted by prettyplease.
//!
//! The module depends on nothing (it declares its own small `Placement`, `DType`, ...
//! types), so it compiles on its own or inside any crate.

use featshard_spec::ir::{DType, IndexScope, PadValue, Placement, Role};
use featshard_spec::names::upper_camel;
use featshard_spec::plan::{FeaturePlan, Plan, TensorPlan};
use proc_macro2::{Ident, Literal, Span, TokenStream};
use quote::quote;

use crate::{header_lines, CodegenError};

/// `<module>.rs`: the placement tables as Rust enums and `const fn`s, formatted.
pub fn rust_module(plan: &Plan) -> Result<String, CodegenError> {
    let tokens = module_tokens(plan);
    let file: syn::File = syn::parse2(tokens)
        .map_err(|e| CodegenError(format!("generated Rust does not parse: {e}")))?;
    let mut out: String = header_lines(plan)
        .iter()
        .map(|l| format!("// {l}\n"))
        .collect();
    out.push('\n');
    out.push_str(&prettyplease::unparse(&file));
    Ok(out)
}

fn ident(name: &str) -> Ident {
    Ident::new(&upper_camel(name), Span::call_site())
}

fn placement(p: &Placement) -> TokenStream {
    match p {
        Placement::Shard(d) => {
            let d = Literal::usize_unsuffixed(*d);
            quote!(Placement::Shard(#d))
        }
        Placement::Replicate => quote!(Placement::Replicate),
    }
}

fn dtype(d: DType) -> TokenStream {
    let v = Ident::new(&upper_camel(d.name()), Span::call_site());
    quote!(DType::#v)
}

fn pad(p: PadValue) -> TokenStream {
    match p {
        PadValue::Bool(b) => quote!(PadValue::Bool(#b)),
        PadValue::Int(i) => {
            let i = Literal::i64_unsuffixed(i);
            quote!(PadValue::Int(#i))
        }
        PadValue::Float(x) if x.is_nan() => quote!(PadValue::Float(f64::NAN)),
        PadValue::Float(x) if x.is_infinite() && x > 0.0 => quote!(PadValue::Float(f64::INFINITY)),
        PadValue::Float(x) if x.is_infinite() => quote!(PadValue::Float(f64::NEG_INFINITY)),
        PadValue::Float(x) => {
            let x = Literal::f64_unsuffixed(x);
            quote!(PadValue::Float(#x))
        }
    }
}

/// `match self { A | B => v1, C => v2 }`: features that share a value share an arm, so
/// the tables read as "which features are placed this way" and stay small for big specs.
fn grouped_arms(idents: &[Ident], values: Vec<TokenStream>) -> TokenStream {
    let mut groups: Vec<(String, TokenStream, Vec<&Ident>)> = Vec::new();
    for (ident, value) in idents.iter().zip(values) {
        let key = value.to_string();
        match groups.iter_mut().find(|(k, _, _)| *k == key) {
            Some((_, _, members)) => members.push(ident),
            None => groups.push((key, value, vec![ident])),
        }
    }
    let arms = groups
        .into_iter()
        .map(|(_, value, members)| quote!(#(Feature::#members)|* => #value));
    quote!(match self { #(#arms),* })
}

/// The Rust module's items as tokens (for the derive macro, which emits them inline).
pub fn module_tokens(plan: &Plan) -> TokenStream {
    let doc = format!(
        " Placements and padding plan of the `{}` feature spec.",
        plan.module
    );
    let consts = consts(plan);
    let semantic = semantic_enum(plan);
    let workflow = workflow_enum(plan);
    let feature = feature_enum(plan);
    quote! {
        #![doc = #doc]
        #consts
        #semantic
        #workflow
        #feature
    }
}

/// The spec's hash, mesh axis names, and the value types the tables use.
fn consts(plan: &Plan) -> TokenStream {
    let sha = &plan.source.sha256;
    let axes = plan.mesh.axes();
    let count = axes.len();
    let dp = match &plan.mesh.dp {
        Some(d) => quote!(Some(#d)),
        None => quote!(None),
    };
    quote! {
        /// SHA-256 of the spec text this module was generated from.
        pub const SPEC_SHA256: &str = #sha;
        /// Names of the CP mesh axes: `(cp0, cp1)`, or `(cp,)` for a one-axis mesh.
        pub const CP_MESH_AXES: [&str; #count] = [#(#axes),*];
        /// Name of the data-parallel mesh axis, if any.
        pub const DP_MESH_AXIS: Option<&str> = #dp;

        /// A DTensor placement on one mesh axis.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Placement {
            Shard(usize),
            Replicate,
        }

        /// Element types, named as in torch.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum DType {
            Bool, Uint8, Int8, Int16, Int32, Int64, Float16, Bfloat16, Float32, Float64,
        }

        /// The value written at pad positions.
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub enum PadValue {
            Bool(bool),
            Int(i64),
            Float(f64),
        }

        /// Which numbering an index value uses once sharded.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum IndexScope {
            Serial,
            ShardLocal,
            PaddedGlobal,
        }

        /// An index-valued feature: what it indexes and how.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub struct IndexRole {
            pub of: Semantic,
            pub scope: IndexScope,
            /// `Some(axis)` when the index is one-hot along that axis.
            pub one_hot: Option<usize>,
            /// The value that names no item (kept through every remap and pad).
            pub none: Option<i64>,
        }
    }
}

fn semantic_enum(plan: &Plan) -> TokenStream {
    let sem_names: Vec<&String> = plan.semantics.keys().collect();
    let sem_idents: Vec<Ident> = sem_names.iter().map(|s| ident(s)).collect();
    let sem_count = sem_names.len();
    let sem_sharded = plan.semantics.values().map(|s| s.sharded);
    quote! {
        /// Axis semantics of the spec.
        // Variants are the spec's names; a name may repeat the enum's (`method_feature`).
        #[allow(clippy::enum_variant_names)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Semantic {
            #(#sem_idents),*
        }

        impl Semantic {
            pub const ALL: [Semantic; #sem_count] = [#(Semantic::#sem_idents),*];

            pub const fn name(self) -> &'static str {
                match self {
                    #(Semantic::#sem_idents => #sem_names),*
                }
            }

            /// Whether axes of this semantic may be split over a CP mesh axis.
            pub const fn sharded(self) -> bool {
                match self {
                    #(Semantic::#sem_idents => #sem_sharded),*
                }
            }
        }
    }
}

fn workflow_enum(plan: &Plan) -> TokenStream {
    let wf_names: Vec<&String> = plan.workflows.keys().collect();
    let wf_idents: Vec<Ident> = wf_names.iter().map(|w| ident(w)).collect();
    let wf_count = wf_names.len();
    let wf_features = plan.workflows.values().map(|fs| {
        let f = fs.iter().map(|f| ident(f));
        quote!(&[#(Feature::#f),*])
    });
    quote! {
        /// Workflows of the spec.
        // Variants are the spec's names; a name may repeat the enum's (`method_feature`).
        #[allow(clippy::enum_variant_names)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Workflow {
            #(#wf_idents),*
        }

        impl Workflow {
            pub const ALL: [Workflow; #wf_count] = [#(Workflow::#wf_idents),*];

            pub const fn name(self) -> &'static str {
                match self {
                    #(Workflow::#wf_idents => #wf_names),*
                }
            }

            /// The workflow's features, sorted by name.
            pub const fn features(self) -> &'static [Feature] {
                match self {
                    #(Workflow::#wf_idents => #wf_features),*
                }
            }
        }
    }
}

/// One value per feature (in name order) for each table of `Feature`.
#[derive(Default)]
struct Columns {
    is_meta: Vec<TokenStream>,
    may_lack: Vec<TokenStream>,
    dtypes: Vec<TokenStream>,
    axes: Vec<TokenStream>,
    channels: Vec<TokenStream>,
    placements: Vec<TokenStream>,
    placements_dp: Vec<TokenStream>,
    pads: Vec<TokenStream>,
    masks: Vec<TokenStream>,
    indices: Vec<TokenStream>,
    workflows: Vec<TokenStream>,
}

impl Columns {
    fn of(plan: &Plan) -> Columns {
        let mut c = Columns::default();
        for f in plan.features.values() {
            let (wf, may_lack) = match f {
                FeaturePlan::Metadata {
                    workflows,
                    optional,
                } => (workflows, *optional),
                // A sample may lack optional features, and the pipeline makes derived ones.
                FeaturePlan::Tensor(t) => (&t.workflows, t.optional || t.derived.is_some()),
            };
            let wf = wf.iter().map(|w| ident(w));
            c.workflows.push(quote!(&[#(Workflow::#wf),*]));
            c.may_lack.push(quote!(#may_lack));
            match f {
                FeaturePlan::Tensor(t) => c.tensor(t),
                FeaturePlan::Metadata { .. } => c.metadata(),
            }
        }
        c
    }

    fn metadata(&mut self) {
        self.is_meta.push(quote!(true));
        self.dtypes.push(quote!(None));
        self.axes.push(quote!(&[]));
        self.channels.push(quote!(&[]));
        self.placements.push(quote!(&[]));
        self.placements_dp.push(quote!(&[]));
        self.pads.push(quote!(None));
        self.masks.push(quote!(&[]));
        self.indices.push(quote!(None));
    }

    fn tensor(&mut self, t: &TensorPlan) {
        self.is_meta.push(quote!(false));
        let d = dtype(t.dtype);
        self.dtypes.push(quote!(Some(#d)));
        let a = t.axes.iter().map(|a| match &a.semantic {
            Some(s) => {
                let s = ident(s);
                quote!(Some(Semantic::#s))
            }
            None => quote!(None),
        });
        self.axes.push(quote!(&[#(#a),*]));
        let c = t.axes.iter().map(|a| match a.size {
            Some(n) => {
                let n = Literal::u64_unsuffixed(n);
                quote!(Some(#n))
            }
            None => quote!(None),
        });
        self.channels.push(quote!(&[#(#c),*]));
        let p = t.placements.iter().map(placement);
        self.placements.push(quote!(&[#(#p),*]));
        let p = t.placements_dp.iter().map(placement);
        self.placements_dp.push(quote!(&[#(#p),*]));
        let pv = pad(t.pad_value);
        self.pads.push(quote!(Some(#pv)));
        let (mask, index) = role(&t.role);
        self.masks.push(mask);
        self.indices.push(index);
    }
}

/// A feature's `mask_of` and `index` values.
fn role(r: &Role) -> (TokenStream, TokenStream) {
    match r {
        Role::Mask { of } => {
            let m = of.iter().map(|s| ident(s));
            (quote!(&[#(Semantic::#m),*]), quote!(None))
        }
        Role::Index(ix) => {
            let of = ident(&ix.of);
            let scope = match ix.scope {
                IndexScope::Serial => quote!(IndexScope::Serial),
                IndexScope::ShardLocal => quote!(IndexScope::ShardLocal),
                IndexScope::PaddedGlobal => quote!(IndexScope::PaddedGlobal),
            };
            let one_hot = match ix.one_hot {
                Some(a) => {
                    let a = Literal::usize_unsuffixed(a);
                    quote!(Some(#a))
                }
                None => quote!(None),
            };
            let none = match ix.none {
                Some(v) => {
                    let v = Literal::i64_unsuffixed(v);
                    quote!(Some(#v))
                }
                None => quote!(None),
            };
            let index = quote!(Some(IndexRole {
                of: Semantic::#of,
                scope: #scope,
                one_hot: #one_hot,
                none: #none,
            }));
            (quote!(&[]), index)
        }
        Role::Data => (quote!(&[]), quote!(None)),
    }
}

fn feature_enum(plan: &Plan) -> TokenStream {
    let names: Vec<&String> = plan.features.keys().collect();
    let idents: Vec<Ident> = names.iter().map(|n| ident(n)).collect();
    let count = names.len();
    let tables = feature_tables(plan, &idents);
    quote! {
        /// Features of the spec, in sorted name order.
        // Variants are the spec's names; a name may repeat the enum's (`method_feature`).
        #[allow(clippy::enum_variant_names)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Feature {
            #(#idents),*
        }

        impl Feature {
            pub const ALL: [Feature; #count] = [#(Feature::#idents),*];

            /// Feature names, sorted; `Feature::ALL[i]` is named `NAMES[i]`.
            pub const NAMES: [&'static str; #count] = [#(#names),*];

            pub const fn name(self) -> &'static str {
                Feature::NAMES[self as usize]
            }

            pub fn from_name(name: &str) -> Option<Feature> {
                let i = Feature::NAMES.binary_search(&name).ok()?;
                Some(Feature::ALL[i])
            }

            #tables
        }
    }
}

/// The `Feature` methods that read the spec's tables: one match per column, features
/// that share a value in one arm.
fn feature_tables(plan: &Plan, idents: &[Ident]) -> TokenStream {
    let c = Columns::of(plan);
    let is_meta_arms = grouped_arms(idents, c.is_meta);
    let may_lack_arms = grouped_arms(idents, c.may_lack);
    let dtypes_arms = grouped_arms(idents, c.dtypes);
    let axes_arms = grouped_arms(idents, c.axes);
    let channels_arms = grouped_arms(idents, c.channels);
    let placements_arms = grouped_arms(idents, c.placements);
    let placements_dp_arms = grouped_arms(idents, c.placements_dp);
    let pads_arms = grouped_arms(idents, c.pads);
    let masks_arms = grouped_arms(idents, c.masks);
    let indices_arms = grouped_arms(idents, c.indices);
    let workflows_arms = grouped_arms(idents, c.workflows);
    quote! {
        /// Non-tensor metadata, passed through untouched.
        pub const fn is_metadata(self) -> bool {
            #is_meta_arms
        }

        /// Whether a sample may lack this feature: it is optional, or the pipeline
        /// derives it.
        pub const fn may_be_absent(self) -> bool {
            #may_lack_arms
        }

        pub const fn dtype(self) -> Option<DType> {
            #dtypes_arms
        }

        /// The semantic of every axis, `None` for channel axes.
        pub const fn axis_semantics(self) -> &'static [Option<Semantic>] {
            #axes_arms
        }

        /// The fixed size of every channel axis, `None` for semantic axes.
        pub const fn channel_sizes(self) -> &'static [Option<u64>] {
            #channels_arms
        }

        /// Placements on the CP sub-mesh, one per axis of `CP_MESH_AXES`.
        pub const fn placements(self) -> &'static [Placement] {
            #placements_arms
        }

        /// Placements with the DP axis in front of the CP sub-mesh's.
        pub const fn placements_dp(self) -> &'static [Placement] {
            #placements_dp_arms
        }

        pub const fn pad_value(self) -> Option<PadValue> {
            #pads_arms
        }

        /// For mask features (1 = valid): the semantics whose pads they zero.
        pub const fn mask_of(self) -> &'static [Semantic] {
            #masks_arms
        }

        pub const fn index(self) -> Option<IndexRole> {
            #indices_arms
        }

        pub const fn workflows(self) -> &'static [Workflow] {
            #workflows_arms
        }
    }
}
