-- What dcgm-exporter reports by default and in Kubernetes mode (issue 13): the profiling
-- activity fields on in its default counters (SM_ACTIVE, the one stored so far, is off
-- there), MIG instances, the host label a node was mapped from, the pod holding the GPU
-- and its owners' labels, and whether any pod holds it at all.
ALTER TABLE {db}.gpu_metrics ADD COLUMN IF NOT EXISTS gr_engine_active Nullable(Float32) AFTER sm_active;
ALTER TABLE {db}.gpu_metrics ADD COLUMN IF NOT EXISTS tensor_active Nullable(Float32) AFTER gr_engine_active;
ALTER TABLE {db}.gpu_metrics ADD COLUMN IF NOT EXISTS dram_active Nullable(Float32) AFTER tensor_active;
ALTER TABLE {db}.gpu_metrics ADD COLUMN IF NOT EXISTS mig_profile LowCardinality(String) DEFAULT '' AFTER dram_active;
ALTER TABLE {db}.gpu_metrics ADD COLUMN IF NOT EXISTS mig_instance LowCardinality(String) DEFAULT '' AFTER mig_profile;
ALTER TABLE {db}.gpu_metrics ADD COLUMN IF NOT EXISTS hostname LowCardinality(String) DEFAULT '' AFTER mig_instance;
ALTER TABLE {db}.gpu_metrics ADD COLUMN IF NOT EXISTS namespace LowCardinality(String) DEFAULT '' AFTER hostname;
ALTER TABLE {db}.gpu_metrics ADD COLUMN IF NOT EXISTS pod String DEFAULT '' AFTER namespace;
ALTER TABLE {db}.gpu_metrics ADD COLUMN IF NOT EXISTS container LowCardinality(String) DEFAULT '' AFTER pod;
ALTER TABLE {db}.gpu_metrics ADD COLUMN IF NOT EXISTS workload String DEFAULT '' AFTER container;
ALTER TABLE {db}.gpu_metrics ADD COLUMN IF NOT EXISTS allocated Nullable(Bool) AFTER workload;
ALTER TABLE {db}.gpu_metrics ADD COLUMN IF NOT EXISTS tags Map(LowCardinality(String), String) AFTER allocated;
