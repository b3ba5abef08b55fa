"""groupmm inside model libraries. `groupmm.integrations.transformers`: the "groupmm" experts
backend of Hugging Face transformers (see docs/integrations.md)."""
