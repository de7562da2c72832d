# STRATA_STATIC_DEPS=ON: a binary that runs on a machine without Debian's libraries (the GPU
# machine). spdlog and fmt become header-only; pcre2, utf8proc, xxhash, hiredis and BLAS link from
# their static archives; glibc, libstdc++ and CUDA's own libraries stay dynamic.
# Included before the layers, after the find_package calls.
add_library(strata_spdlog_header_only INTERFACE)
target_compile_definitions(strata_spdlog_header_only INTERFACE SPDLOG_FMT_EXTERNAL FMT_HEADER_ONLY)
set(STRATA_SPDLOG strata_spdlog_header_only)

function(strata_use_static_archive target archive_name)
  find_library(_lib NAMES ${archive_name} NO_CACHE REQUIRED)
  set_target_properties(${target} PROPERTIES INTERFACE_LINK_LIBRARIES "${_lib}" INTERFACE_LINK_OPTIONS "")
  set_property(TARGET ${target} PROPERTY INTERFACE_LINK_DIRECTORIES "")
endfunction()
strata_use_static_archive(PkgConfig::PCRE2 libpcre2-8.a)
strata_use_static_archive(PkgConfig::UTF8PROC libutf8proc.a)
strata_use_static_archive(PkgConfig::XXHASH libxxhash.a)
strata_use_static_archive(PkgConfig::HIREDIS libhiredis.a)
# Static pcre2 must not expect dllimport-style declarations.
set_property(TARGET PkgConfig::PCRE2 APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS PCRE2_STATIC)
