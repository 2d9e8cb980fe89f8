"""The test and benchmark harness: simulated containers (``containers``), the one-container worker they run
(``worker``), its models (``models``, ``hf_models``), and real servers on loopback (``service``: `cachesvc serve`;
``s3server``: rclone S3). tests/, bench/ and the restart demo (demo/restart.py) use it."""
