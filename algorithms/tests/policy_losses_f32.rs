//! Every policy loss of verl's registry against its float32 vectors (see
//! `policy_loss_registry/mod.rs`).

mod policy_loss_registry;

#[test]
fn policy_loss_registry_vectors_f32() {
    policy_loss_registry::run(policy_loss_registry::Float::F32);
}
