//! What is shipped to a cluster, rendered and checked with the real tools: the
//! kustomize tree (`deploy`) and the Helm chart (`helm_chart`). One test binary of
//! modules.

mod deploy;
mod helm_chart;
