"""Deployments: many models, backends and replicas served by one host (docs/deployments.md)."""

from werk_host.deployments.profile import (
    PROFILE_FILENAME,
    DeploymentProfile,
    InstanceSpec,
    ProfileError,
    load_profile,
    parse_duration,
    parse_profile,
    profile_from_models,
)

__all__ = [
    "PROFILE_FILENAME",
    "DeploymentProfile",
    "InstanceSpec",
    "ProfileError",
    "load_profile",
    "parse_duration",
    "parse_profile",
    "profile_from_models",
]
