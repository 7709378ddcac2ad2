"""Operations on a running cluster: doctor, rollout, load test, the capacity and images CLIs."""
