//! flowrl's derives, re-exported by `flowrl_engine`: a node kind writes its parameters once, as
//! the serde struct it deserializes.
//!
//! - `#[derive(Params)]` on a `Deserialize` struct implements `flowrl_engine::ParamSchema`: one
//!   `ParamSpec` per field, in field order, with the key serde reads (`#[serde(rename)]`,
//!   `rename_all`), the `ParamType` of the field's Rust type (`flowrl_engine::ParamField`), the
//!   field's doc comment as its doc, and the rest from `#[param(...)]`, named like the
//!   `ParamSpec` builder methods: `default = <expr>` (anything `Into<serde_json::Value>`; an
//!   integer on a float field is a float, as the compiler stores a written one), `min`, `max`
//!   (inclusive bounds), `gt`, `lt` (exclusive), `required`, `switch`, `resource = "kind"`,
//!   `one_of = <&[&str]>` (choices that are not a `ParamChoice` enum of this crate). A
//!   `#[serde(flatten)]` field adds its type's specs there (or `#[param(specs = <expr>)]`'s).
//!   It also implements `ParamField` for the struct, so a field of its type is a table.
//! - `#[derive(ParamChoice)]` on a plain enum implements `flowrl_engine::ParamChoice` (the variants'
//!   names: snake_case, or `#[serde(rename = "...")]`, or the enum's `#[serde(rename_all)]`),
//!   `Display`, `FromStr`, serde's `Serialize` and `Deserialize` (by name: do not derive them too),
//!   `From<Enum> for serde_json::Value` (so it can be a default) and `ParamField` (an enum
//!   parameter).
//!
//! Checked at compile time: a field that is neither an `Option`, nor a table, nor has a default
//! (ours or serde's) nor `required` would fail to deserialize when the key is absent, and a
//! `switch` table that is not an `Option` would too; both are errors naming the field.
//!
//! What it does not do: no validation beyond the schema (that is the kind's `validate` hook), no
//! generic structs.

mod attrs;
mod choice;
mod params;

use proc_macro::TokenStream;

/// The parameter schema of a node or resource kind from its serde struct (see the crate doc).
#[proc_macro_derive(Params, attributes(param, serde))]
pub fn derive_params(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    params::expand(input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// String choices from a plain enum (see the crate doc).
#[proc_macro_derive(ParamChoice, attributes(serde))]
pub fn derive_param_choice(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    choice::expand(input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}
