//! Nothing to link: deploy/ holds what operators install (grafana/,
//! prometheus/, packaging/) and its tests (tests/) check those files
//! against what the components serve and do.
