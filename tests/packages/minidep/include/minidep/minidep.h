// Test dependency fetched by git (tests/packages/mini_kernel declares it with GIT_REPOSITORY).
#pragma once
#define MINIDEP_MAGIC 4242
