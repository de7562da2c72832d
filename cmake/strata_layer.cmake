# strata_layer(NAME DEPS ...): a static library from every .cpp under src/NAME (CUDA sources
# under src/NAME/cuda are left to the CUDA build). A layer with no sources yet is an
# INTERFACE library, so the layers above can already name it.
function(strata_layer name)
  cmake_parse_arguments(L "" "" "DEPS" ${ARGN})
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/${name}/*.cpp)
  list(FILTER srcs EXCLUDE REGEX "/cuda/")
  if(srcs)
    add_library(strata_${name} STATIC ${srcs})
    target_include_directories(strata_${name} PUBLIC ${CMAKE_SOURCE_DIR}/src)
    target_link_libraries(strata_${name} PUBLIC ${L_DEPS})
  else()
    add_library(strata_${name} INTERFACE)
    target_include_directories(strata_${name} INTERFACE ${CMAKE_SOURCE_DIR}/src)
    target_link_libraries(strata_${name} INTERFACE ${L_DEPS})
  endif()
endfunction()
