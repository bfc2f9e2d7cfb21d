"""The few Kubernetes API calls Zeroscale makes (see client.KubeClient)."""
