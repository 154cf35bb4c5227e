//! The simulations (src/bin/: `fleet_sim` for `make sim`, `sim_scale` for
//! `make sim-scale`, `sim_regions` for `make sim-regions`) and the kit
//! they share ([`kit`]). Each keeps its own model; what they have in
//! common (the seeded random numbers, the seed traffic shape, the
//! report's Markdown and machine facts, the charts' parts) lives once.

pub mod kit;
