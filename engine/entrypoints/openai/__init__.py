"""The OpenAI wire format both servers share: request and response models, error bodies,
logprobs objects, tool calls. Import-light: nothing here is imported by this file, so the
gateway can take the pydantic models without FastAPI or torch."""
