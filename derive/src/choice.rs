//! `#[derive(ParamChoice)]`: a plain enum as a string parameter with a fixed set of values.

use crate::attrs::{RenameRule, serde_of};
use proc_macro2::TokenStream;
use quote::quote;
use syn::{Data, DeriveInput, Error, Fields, LitStr};

pub fn expand(input: DeriveInput) -> syn::Result<TokenStream> {
    let name = &input.ident;
    if !input.generics.params.is_empty() {
        return Err(Error::new(
            name.span(),
            "`ParamChoice` does not support generic enums",
        ));
    }
    let Data::Enum(data) = &input.data else {
        return Err(Error::new(
            name.span(),
            "`ParamChoice` derives string choices from a plain enum",
        ));
    };
    if data.variants.is_empty() {
        return Err(Error::new(name.span(), "`ParamChoice` needs a variant"));
    }
    let rule = serde_of(&input.attrs)?
        .rename_all
        .unwrap_or(RenameRule::Snake);
    let mut variants = Vec::new();
    let mut names: Vec<LitStr> = Vec::new();
    for v in &data.variants {
        if !matches!(v.fields, Fields::Unit) {
            return Err(Error::new(
                v.ident.span(),
                "`ParamChoice` variants carry no data",
            ));
        }
        let s = serde_of(&v.attrs)?
            .rename
            .unwrap_or_else(|| rule.variant(&v.ident.to_string()));
        if let Some(dup) = names.iter().find(|n| n.value() == s) {
            return Err(Error::new(
                v.ident.span(),
                format!("two variants are named \"{}\"", dup.value()),
            ));
        }
        variants.push(&v.ident);
        names.push(LitStr::new(&s, v.ident.span()));
    }
    let engine = quote!(::flowrl_engine::params);
    let serde = quote!(#engine::__derive::serde);
    Ok(quote! {
        impl #engine::ParamChoice for #name {
            const ALL: &'static [(Self, &'static str)] = &[#((#name::#variants, #names)),*];
            const NAMES: &'static [&'static str] = &[#(#names),*];
            fn name(&self) -> &'static str {
                match self {
                    #(#name::#variants => #names,)*
                }
            }
        }

        impl ::std::fmt::Display for #name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(#engine::ParamChoice::name(self))
            }
        }

        impl ::std::str::FromStr for #name {
            type Err = #engine::ChoiceError;
            fn from_str(s: &str) -> ::std::result::Result<Self, Self::Err> {
                match s {
                    #(#names => ::std::result::Result::Ok(#name::#variants),)*
                    _ => ::std::result::Result::Err(#engine::ChoiceError::new::<Self>(s)),
                }
            }
        }

        impl #serde::Serialize for #name {
            fn serialize<S: #serde::Serializer>(&self, s: S) -> ::std::result::Result<S::Ok, S::Error> {
                s.serialize_str(#engine::ParamChoice::name(self))
            }
        }

        impl<'de> #serde::Deserialize<'de> for #name {
            fn deserialize<D: #serde::Deserializer<'de>>(d: D) -> ::std::result::Result<Self, D::Error> {
                #engine::__derive::deserialize_choice(d)
            }
        }

        impl ::std::convert::From<#name> for #engine::__derive::serde_json::Value {
            fn from(v: #name) -> Self {
                #engine::__derive::serde_json::Value::String(
                    ::std::string::ToString::to_string(#engine::ParamChoice::name(&v)),
                )
            }
        }

        impl #engine::ParamField for #name {
            fn param_type() -> #engine::ParamType {
                #engine::ParamType::Enum(<Self as #engine::ParamChoice>::choices())
            }
        }
    })
}
