"""SWE-bench tasks: the environment, the hack-resistant grader, the harness's reports and the bundled benchmark."""
