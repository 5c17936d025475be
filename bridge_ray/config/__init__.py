"""Typed, validated configuration: YAML file + ``key.sub=value`` overrides -> :class:`Config`.

``schema`` holds the sections, ``encoders`` the encoder presets and the resolved encoder spec, ``loading`` reads
files and overrides and locates errors (file:line or override) and derives a config from another (:func:`derive`,
validated the same way), ``renamed`` the keys older configs still set and what replaced them. Import from here.
"""

from bridge_ray.config.loading import INPUT_PATHS, ConfigError, apply_override, derive, dump_config, load_config
from bridge_ray.config.schema import (
    AlgorithmConfig,
    CheckpointConfig,
    Config,
    DataConfig,
    EncoderConfig,
    EngineConfig,
    EvalConfig,
    GRPOConfig,
    HFEngineConfig,
    IndexConfig,
    JudgeConfig,
    LearnerConfig,
    LearnerRole,
    LoraConfig,
    OptimConfig,
    PolicyConfig,
    PolicyLearnerRole,
    PolicyLoraConfig,
    RetrievalConfig,
    RetrieverLearnerRole,
    RetrieverObjectiveConfig,
    RoleConfig,
    RolesConfig,
    RolloutConfig,
    RunConfig,
    SamplerRole,
    Section,
    ServerConfig,
    ShardHolderRole,
    StageConfig,
    TelemetryConfig,
    TwoStateConfig,
    VLLMEngineConfig,
    WarmupConfig,
)

__all__ = [
    "INPUT_PATHS", "AlgorithmConfig", "CheckpointConfig", "Config", "ConfigError", "DataConfig", "EncoderConfig",
    "EngineConfig", "EvalConfig", "GRPOConfig", "HFEngineConfig", "IndexConfig", "JudgeConfig",
    "LearnerConfig", "LearnerRole", "LoraConfig", "OptimConfig", "PolicyConfig", "PolicyLearnerRole",
    "PolicyLoraConfig", "RetrievalConfig", "RetrieverLearnerRole", "RetrieverObjectiveConfig", "RoleConfig",
    "RolesConfig", "RolloutConfig", "RunConfig", "SamplerRole", "Section", "ServerConfig", "ShardHolderRole",
    "StageConfig", "TelemetryConfig", "TwoStateConfig", "VLLMEngineConfig", "WarmupConfig", "apply_override",
    "derive", "dump_config", "load_config",
]
