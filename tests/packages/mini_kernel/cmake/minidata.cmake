# A second dependency, downloaded as an archive (the URL form sgl-kernel uses from SGLang 0.5.14).
FetchContent_Declare(
    repo-minidata
    URL      ${MINI_DEPS_URL}/minidata-1.0.tar.gz
    URL_HASH SHA256=b449faae6f5de342e0f0b9a5132eb5a1ea5f8ea27faf50626cadc00f3d964bc8
)
FetchContent_Populate(repo-minidata)
