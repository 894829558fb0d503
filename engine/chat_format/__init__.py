"""Chat formats that are more than a chat template: harmony (gpt-oss), with its channels."""
