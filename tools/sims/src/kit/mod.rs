//! What the simulations share: [`rng`] (seeded, reproducible), [`shape`]
//! (the seed traffic: who sends what on which plan), [`text`] (numbers,
//! verdicts and Markdown tables of a report), [`machine`] (when and where
//! a run ran) and [`chart`] (the SVG charts' common parts).

pub mod chart;
pub mod machine;
pub mod rng;
pub mod shape;
pub mod text;
